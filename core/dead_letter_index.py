"""Where each task's dead letters sit in the DLQ topic, by task id, kept in Redis.

The batcher that writes a letter records its place (``partition-offset``) once the broker
has acknowledged it; on-call's look-ups by task id then read the letters at their places
instead of scanning the topic. A place is kept as long as an unfinished task's record
(the DLQ topic's retention is of that order). A letter whose place was never recorded (a
batcher that stopped in between) is still found by a scan, which is bounded per call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from brimful.core.redis_client import RedisClient
from brimful.core.redis_keys import RedisKeys


def entry_id(partition: int, offset: int) -> str:
    """A letter's id: its place in the DLQ topic."""
    return f"{partition}-{offset}"


class DeadLetterIndex:
    """Task id -> the places of its dead letters."""

    def __init__(self, redis: RedisClient, keys: RedisKeys, ttl_s: int) -> None:
        self._redis = redis
        self._keys = keys
        self._ttl_s = ttl_s

    async def add(self, places: Iterable[tuple[str, int, int]]) -> None:
        """Record (task id, partition, offset) of letters just written, in one round trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for task_id, partition, offset in places:
                key = self._keys.dead_letter_places(task_id)
                pipe.sadd(key, entry_id(partition, offset))
                pipe.expire(key, self._ttl_s)
            await pipe.execute()

    async def places(self, task_ids: Sequence[str]) -> dict[str, list[str]]:
        """Each task's recorded letter ids, in topic order within a partition (tasks with
        none are left out)."""
        if not task_ids:
            return {}
        async with self._redis.pipeline(transaction=False) as pipe:
            for task_id in task_ids:
                pipe.smembers(self._keys.dead_letter_places(task_id))
            found = await pipe.execute()
        return {
            task_id: sorted((member.decode() for member in members), key=lambda e: tuple(int(p) for p in e.split("-")))
            for task_id, members in zip(task_ids, found)
            if members
        }
