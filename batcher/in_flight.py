"""The batches a batcher service has sent and not yet seen end: each runs as a task of
its own until its tasks are final (``until_done``), then finishes its offsets for the
committer. Batches still running past the shutdown's wait are stopped, their offsets
left uncommitted.

A batch leaves its accumulator through ``flushed_batch``: its rows leave the waiting set,
and how long they waited (in the accumulator, and before it) is counted, once a batch."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Protocol

from brimful.batcher.accumulator import Pending
from brimful.batcher.intake import Estimates, until_done
from brimful.batcher.partition_state import PartitionState, WaitingRows
from brimful.batcher.policy import FlushReason
from brimful.core import metrics
from brimful.core.histogram_batches import observe_all
from brimful.workers.batch import Batch, BatchItem
from brimful.workers.retry_policy import BatchRetryPolicy
from brimful.workers.slot import Slot

log = logging.getLogger("brimful.batcher")

OVERDUE_CANCEL_WAIT_S = 5.0  # how long a batch cancelled at shutdown may take to unwind


class Runner(Protocol):
    """What the batcher needs of the GPU side (``workers.batch_runner.BatchRunner``)."""

    async def run(self, batch: Batch) -> object: ...

    async def abandon(self, batch: Batch, error: BaseException) -> None: ...


class InFlightBatches:
    """Starts batches, counts them, and finishes their offsets as they end."""

    def __init__(
        self,
        runner: Runner,
        retry: BatchRetryPolicy,
        store_retry_s: float,
        waiting: WaitingRows,
        estimates: Estimates,
        clock: Callable[[], float],
        offsets_finished: Callable[[], None],
        batch_ended: Callable[[], None],
    ) -> None:
        self._runner = runner
        self._retry = retry
        self._store_retry_s = store_retry_s
        self._waiting = waiting
        self._estimates = estimates
        self._clock = clock
        self._offsets_finished = offsets_finished  # the committer wants a turn
        self._batch_ended = batch_ended  # the service's loop wakes: a slot is free
        self.total = 0

    def start(self, state: PartitionState, rows: list[Pending[BatchItem]], reason: FlushReason, slot: Slot) -> None:
        """Send ``rows`` of ``state``'s partition as one batch on ``slot``."""
        batch = flushed_batch(state.tp.partition, rows, reason, slot, self._waiting, self._clock())
        self.total += 1
        task = asyncio.create_task(self._run(state, batch), name=f"batch-{batch.batch_id}")
        state.in_flight.add(task)
        task.add_done_callback(lambda t: self._ended(state, t))

    def finish_offsets(self, state: PartitionState, offsets: list[int]) -> None:
        """Mark ``offsets`` of ``state``'s partition finished, for the committer."""
        if state.tracker is not None:
            for offset in offsets:
                state.tracker.finish(offset)
        self._offsets_finished()

    async def stop_overdue(self, overdue: list[asyncio.Task[None]]) -> None:
        """Cancel batches still running past the shutdown's wait (left running, they met the
        model pool closed under them, retried and could fail their tasks to the DLQ): their
        offsets stay uncommitted, so the partition's next owner runs them again."""
        if not overdue:
            return
        log.warning(
            "batches still running at shutdown were stopped; their rows are read again", extra={"batches": len(overdue)}
        )
        for task in overdue:
            task.cancel()
        await asyncio.wait(overdue, timeout=OVERDUE_CANCEL_WAIT_S)

    async def _run(self, state: PartitionState, batch: Batch) -> None:
        started = self._clock()
        await until_done(
            batch.batch_id,
            lambda: self._runner.run(batch),
            lambda error: self._runner.abandon(batch, error),
            self._retry,
            self._store_retry_s,
        )
        self._estimates.service += 0.2 * ((self._clock() - started) - self._estimates.service)
        self.finish_offsets(state, [item.offset for item in batch.items])

    def _ended(self, state: PartitionState, task: asyncio.Task[None]) -> None:
        state.in_flight.discard(task)
        self.total -= 1
        self._batch_ended()


def flushed_batch(
    partition: int, rows: list[Pending[BatchItem]], reason: FlushReason, slot: Slot, waiting: WaitingRows, now: float
) -> Batch:
    """The batch of ``rows`` flushed from ``partition`` for ``reason`` onto ``slot`` at ``now``."""
    label = str(partition)
    metrics.FLUSHES.labels(label, reason.value).inc()
    waits = [now - row.arrived_at for row in rows]
    upstream_total = 0.0
    for row in rows:
        waiting.left(row.item.task_id)
        upstream_total += row.item.upstream_s
    observe_all(metrics.QUEUE_WAIT.labels(label), waits)
    waited_total = sum(waits)
    metrics.BATCH_STAGE.labels("to_batcher").observe(upstream_total / len(rows))
    metrics.BATCH_STAGE.labels("in_batch").observe(waited_total / len(rows))
    return Batch(
        batch_id=uuid.uuid4().hex,
        partition=partition,
        items=[row.item for row in rows],
        reason=reason.value,
        slot=slot,
        flushed_ns=time.time_ns(),
    )
