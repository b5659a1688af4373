"""Checks of the set of unconfirmed tasks (``core/admission.py``), shared by the
tests on one Redis and on a Redis Cluster."""

from __future__ import annotations

import uuid

from brimful.core.admission import task_of, unconfirmed_member
from brimful.core.clock import now_ms
from brimful.core.redis_client import as_text
from brimful.core.task_record import NewTask, TaskStatus
from brimful.core.task_store import TaskStore


async def unconfirmed_ids(store: TaskStore) -> set[str]:
    """The task ids the store's unconfirmed set holds."""
    members = await store._redis.zrange(store.keys.unconfirmed, 0, -1)
    return {task_of(as_text(member))[0] for member in members}


async def check_stale_entries_give_their_quota_back(store: TaskStore) -> None:
    """Tasks recorded long ago and never confirmed leave their tenant's in-flight count
    when swept; a fresh one stays counted; every record stays as it was."""
    now = now_ms()
    tenant = f"swept-{uuid.uuid4().hex[:6]}"
    # 20 s old: past the sweep's cutoff below, within the store's waiting TTL (60 s).
    stale = [NewTask(uuid.uuid4().hex, now - 20_000, tenant, max_in_flight=3) for _ in range(2)]
    fresh = NewTask(uuid.uuid4().hex, now, tenant, max_in_flight=3)
    assert await store.create_queued_many([*stale, fresh]) == [None, None, None]
    refused = NewTask(uuid.uuid4().hex, now, tenant, max_in_flight=3)
    assert await store.create_queued_many([refused]) == [3]
    tracked = await unconfirmed_ids(store)
    assert {task.task_id for task in [*stale, fresh]} <= tracked
    assert refused.task_id not in tracked  # nothing of a refused task stays

    released = await store.unconfirmed.release_stale(now - 10_000)

    assert sorted(released) == sorted((task.task_id, tenant) for task in stale)
    tracked = await unconfirmed_ids(store)
    assert fresh.task_id in tracked and not {task.task_id for task in stale} & tracked
    assert await store.unconfirmed.release_stale(now - 10_000) == []  # a second sweep finds nothing
    for task in stale:  # a swept task's record is left as it was: it may yet run
        record = await store.get(task.task_id)
        assert record is not None and record.status is TaskStatus.QUEUED
    # The stale tasks' quota is free again: the refused task is taken now, the limit still holds.
    third = NewTask(uuid.uuid4().hex, now, tenant, max_in_flight=3)
    assert await store.create_queued_many([refused, third]) == [None, None]
    assert await store.create_queued_many([NewTask(uuid.uuid4().hex, now, tenant, max_in_flight=3)]) == [3]
    confirmed = [fresh, refused, third]
    await store.unconfirmed.confirm([unconfirmed_member(task.task_id, tenant) for task in confirmed])
    assert not {task.task_id for task in confirmed} & await unconfirmed_ids(store)
