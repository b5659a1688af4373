"""Tasks recorded as queued whose submission has not been confirmed yet.

An API records a task in Redis before it sends the task's record to the broker, and
answers 202 only once the broker acknowledges it. Between the two the task already counts
in its tenant's tasks in flight. An API killed in between (SIGKILL, its node lost) can
neither take the task back nor send it: without this record the task would hold its
tenant's quota until the waiting TTL trims it (days).

So admission also puts each task it records in one sorted set (``RedisKeys.unconfirmed``),
scored by when it was recorded, and the API takes it out again once the broker has
answered (in bulk, about a second later: ``api/tasks/submission_receipts.py``). An entry older
than the longest a submission can take belongs to a submission that stopped without a
word. Whether its record reached the broker cannot be told from here, so the sweep does
the one thing that is right either way: it takes the task out of its tenant's in-flight
set. A task that did reach the broker still runs (its final move would have taken it out
anyway); one that did not stays ``queued``, unknown to anyone (its client had no answer),
until its record expires. A retry with its Idempotency-Key sends it again
(``api/tasks/idempotency.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from brimful.core.redis_client import RedisClient, as_text
from brimful.core.redis_keys import RedisKeys

# Members a command names at most: one ZREM of a busy second's confirmations stays small.
COMMAND_MEMBERS = 1000


def unconfirmed_member(task_id: str, tenant: str) -> str:
    """The set's member for a task: its id, a space, its tenant (ids never hold a space).
    The admission script builds the same string (``core/admission.py``)."""
    return f"{task_id} {tenant}"


def task_of(member: str) -> tuple[str, str]:
    """(task id, tenant) of a member."""
    task_id, _, tenant = member.partition(" ")
    return task_id, tenant


class UnconfirmedTasks:
    """The set of recorded, unconfirmed tasks: confirming entries, sweeping stale ones."""

    def __init__(self, redis: RedisClient, keys: RedisKeys) -> None:
        self._redis = redis
        self._keys = keys

    async def confirm(self, members: Sequence[str]) -> None:
        """Take ``members`` out: the broker answered for their tasks (or they were taken back)."""
        key = self._keys.unconfirmed
        for start in range(0, len(members), COMMAND_MEMBERS):
            await self._redis.zrem(key, *members[start : start + COMMAND_MEMBERS])

    async def release_stale(self, recorded_before_ms: int) -> list[tuple[str, str]]:
        """Take the tasks recorded before ``recorded_before_ms`` and never confirmed out of
        their tenants' in-flight sets and out of this one, at most COMMAND_MEMBERS a call;
        returns their (task id, tenant). Safe beside another API doing the same."""
        key = self._keys.unconfirmed
        raw = await self._redis.zrangebyscore(key, "-inf", f"({recorded_before_ms}", start=0, num=COMMAND_MEMBERS)
        members = [as_text(member) for member in raw if isinstance(member, bytes | str)]  # no scores asked
        if not members:
            return []
        tasks = [task_of(member) for member in members]
        # In-flight entries first: a failure between the two leaves the member to sweep again.
        async with self._redis.pipeline(transaction=False) as pipe:
            for task_id, tenant in tasks:
                pipe.zrem(self._keys.in_flight(tenant), task_id)
            await pipe.execute()
        await self._redis.zrem(key, *members)
        return tasks
