"""Each running batcher's live status in Redis, so one place shows them all."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from brimful.core.redis_client import RedisClient
from brimful.core.redis_keys import RedisKeys


class StatusBoard:
    """Batchers publish a snapshot every second or so; readers list the fresh ones.

    Each snapshot is a key with a short TTL, and its member is named in a set beside it
    (one hash slot): a reader reads the set and the keys it names, never scanning the
    keyspace, which holds every task too."""

    def __init__(self, redis: RedisClient, keys: RedisKeys) -> None:
        self._redis = redis
        self._keys = keys

    async def publish(self, member: str, snapshot: Mapping[str, Any], ttl_s: float) -> None:
        # A short TTL makes a dead batcher drop off the board by itself.
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(
                self._keys.batcher_status(member), json.dumps({"member": member, **snapshot}), px=int(ttl_s * 1000)
            )
            pipe.sadd(self._keys.batcher_members, member)
            await pipe.execute()

    async def remove(self, member: str) -> None:
        """Take a stopping batcher off the board at once."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._keys.batcher_status(member))
            pipe.srem(self._keys.batcher_members, member)
            await pipe.execute()

    async def read_all(self) -> list[dict[str, Any]]:
        named = await self._redis.smembers(self._keys.batcher_members)
        members = sorted(m.decode() if isinstance(m, bytes) else m for m in named)
        if not members:
            return []
        values = await self._redis.mget([self._keys.batcher_status(m) for m in members])
        gone = [member for member, value in zip(members, values) if value is None]
        if gone:  # expired: a batcher that publishes again names itself again
            await self._redis.srem(self._keys.batcher_members, *gone)
        return [json.loads(value) for value in values if value is not None]
