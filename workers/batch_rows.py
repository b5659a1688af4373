"""Which of a batch's rows go on to run, decided against the task store just before the
call: rows past their deadline are expired, and rows whose record Redis lost are
re-created from their Kafka record; ``known_tasks`` is what the store step gives the task
store to do the same for a record lost during the call.

A task may carry a deadline (``deadline_ms`` at submission, ``deadline_at_ms`` on its
record). One whose deadline has passed when its batch is about to run is never computed
(``past_deadline``, pure): the client said its result would be of no use by then, and the
slot goes to rows still in time. It is decided at the last moment before the call, on the
batcher's wall clock against the deadline the API set on its own (hosts keep their clocks
in sync), so a row is never dropped that could still have been answered in time."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from brimful.core import metrics
from brimful.core.task_record import KnownTask
from brimful.core.task_store import TaskStore
from brimful.workers.batch import Batch, BatchItem, BatchOutcome

log = logging.getLogger("brimful.worker")


async def expire_late(store: TaskStore, batch: Batch, outcome: BatchOutcome, now_ms: int) -> list[BatchItem]:
    """Move the batch's queued tasks whose deadline has passed to expired (never
    computed, counted); the items left to run."""
    late = past_deadline(batch.items, now_ms)
    if not late:
        return batch.items
    reasons = {item.task_id: expiry_reason(item, now_ms) for item in late}
    expired = set(await store.mark_expired(reasons))
    if expired:
        outcome.expired = len(expired)
        metrics.TASKS_EXPIRED.inc(len(expired))
        for task_id in expired:
            log.info("task expired before dispatch", extra={"task_id": task_id, "batch_id": batch.batch_id})
    return [item for item in batch.items if item.task_id not in expired]


def known_tasks(items: Iterable[BatchItem], default_model: str) -> dict[str, KnownTask]:
    """What each item's Kafka record says of its task, by id: enough to write its record
    again wherever Redis lost it (at dispatch, or when its result is stored)."""
    return {
        item.task_id: KnownTask(
            item.task_id, item.request.submitted_at_ms, item.request.tenant, item.request.model or default_model
        )
        for item in items
    }


async def recreate_missing(
    store: TaskStore, batch: Batch, candidates: list[BatchItem], running: set[str], default_model: str
) -> list[str]:
    """Bring back the tasks of the batch whose record Redis lost (the Kafka record is
    the source of truth): they run with the rest, and their tenant's quota frees when
    they end. Final, cancelled and withdrawn tasks stay as they are."""
    known = known_tasks([item for item in candidates if item.task_id not in running], default_model)
    recreated = await store.recreate_missing(list(known.values()))
    if recreated:
        metrics.TASKS_RECREATED.inc(len(recreated))
        for task_id in recreated:
            log.warning(
                "task record was gone; re-created from its Kafka record",
                extra={"task_id": task_id, "batch_id": batch.batch_id},
            )
    return recreated


def past_deadline(items: Sequence[BatchItem], now_ms: int) -> list[BatchItem]:
    """The items whose deadline is before ``now_ms`` (wall clock); those with none never are."""
    return [item for item in items if 0 < item.request.deadline_at_ms < now_ms]


def expiry_reason(item: BatchItem, now_ms: int) -> dict[str, object]:
    """What an expired task's record says: how late its batch was."""
    late_ms = now_ms - item.request.deadline_at_ms
    return {
        "class": "expired",
        "message": f"its deadline passed {late_ms} ms before it could be sent to the model; it was not computed",
        "deadline_at_ms": item.request.deadline_at_ms,
    }
