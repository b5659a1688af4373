"""A due batch on its way out of its accumulator, and the model's health it depends on.

``SlotLeasing``: where batchers share endpoints, a slot is leased before a batch's rows
leave the accumulator. A due batch takes a slot from this batcher's view of the pool, but
other batchers may hold the endpoint's every slot: the lease in Redis says. Leased first,
a refused batch keeps filling in its accumulator (rows arriving meanwhile join it) and
tries again when the endpoint is next counted free; leased after its rows were taken, it
waited outside the accumulator with what it had (two batchers on one endpoint: 45 rows a
call against 63.7 for one, bench/results/scale.md). One lease at a time a partition.

``flushed_batch``: the batch leaves its accumulator, its rows leave the waiting set, and
how long they waited (in the accumulator, and before it) is counted, once a batch.

``InFlightBatches``: the batches sent and not yet seen end. Each runs as a task of its own
until its tasks are final (``until_done``), then finishes its offsets for the committer.
Batches still running past the shutdown's wait are stopped, their offsets left
uncommitted.

``ModelHealth``: consumption pauses while every endpoint's circuit is open, so an outage
costs neither retries nor dead letters, and resumes by itself once one closes; endpoints
out of service are probed."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Protocol

from aiokafka import AIOKafkaConsumer

from brimful.batcher.accumulator import Pending
from brimful.batcher.intake import Estimates, until_done
from brimful.batcher.partition_state import PartitionState, WaitingRows
from brimful.batcher.policy import FlushReason
from brimful.core import metrics
from brimful.workers.batch import Batch, BatchItem, observe_all
from brimful.workers.model_pool import ModelPool
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


# --- from batcher/dispatch.py ---
# Slots leased before their rows leave the accumulator, where batchers share endpoints.


class SlotLeasing:
    """Lease attempts under way, and leased slots waiting for the loop, by partition."""

    def __init__(self, pool: ModelPool, wake: Callable[[], None]) -> None:
        self._pool = pool
        self._wake = wake
        self._pending: dict[int, tuple[asyncio.Task[None], Slot]] = {}
        self._ready: dict[int, tuple[Slot, FlushReason]] = {}

    def pending(self, partition: int) -> bool:
        """Whether a lease for ``partition`` is on its way (its batch keeps filling)."""
        return partition in self._pending

    def start(self, partition: int, slot: Slot, reason: FlushReason) -> None:
        """Lease ``slot`` for ``partition``'s batch, due for ``reason``; the loop is woken
        when it is settled."""
        task = asyncio.create_task(self._lease(partition, slot, reason), name="brimful-lease")
        self._pending[partition] = (task, slot)

    async def _lease(self, partition: int, slot: Slot, reason: FlushReason) -> None:
        try:
            leased = await self._pool.try_lease(slot)
        except asyncio.CancelledError:
            raise  # dropped: try_lease gave the slot back
        except Exception as error:  # Redis failing: the batch goes, and its call secures the slot as before
            log.warning("could not lease a slot", extra={"partition": partition, "error": repr(error)})
            leased = True
        if leased:
            self._ready[partition] = (slot, reason)
        self._pending.pop(partition, None)
        self._wake()

    def take_ready(self, partition: int) -> tuple[Slot, FlushReason] | None:
        """A slot leased for ``partition``'s batch, with why the batch was due."""
        return self._ready.pop(partition, None)

    def drop(self, partition: int) -> None:
        """Give back what ``partition`` holds or is leasing (revoked, stopping, or no rows
        left to send)."""
        pending = self._pending.pop(partition, None)
        if pending is not None:
            pending[0].cancel()
            self._pool.abandon(pending[1])  # a task cancelled before it ran never gives it back
        ready = self._ready.pop(partition, None)
        if ready is not None:
            self._pool.release(ready[0])

    def drop_all(self) -> None:
        for partition in {*self._pending, *self._ready}:
            self.drop(partition)

    def idle_ready(self, partitions_with_rows: set[int]) -> None:
        """Give back leased slots whose partition has no rows left (cancelled meanwhile)."""
        for partition in [p for p in self._ready if p not in partitions_with_rows]:
            self.drop(partition)


# --- from batcher/dispatch.py ---
# Following the model's health from the batcher: consumption pauses while every endpoint's


class ModelHealth:
    """Pauses and resumes the partitions with the model's health, and probes endpoints."""

    def __init__(
        self,
        pool: ModelPool,
        consumer: AIOKafkaConsumer,
        partitions: Mapping[int, PartitionState],
        wake: Callable[[], None],
    ) -> None:
        self._pool = pool
        self._consumer = consumer
        self._partitions = partitions
        self._wake = wake
        self.paused = False  # every partition paused while the model is unreachable
        self._probe: asyncio.Task[None] | None = None

    @property
    def watching(self) -> bool:
        """Whether some circuit is open: the loop looks again often, to see it close."""
        return self.paused or self._pool.some_circuit_open

    def follow(self, batches_in_flight: int) -> None:
        """Look at the model's health now (each turn of the loop)."""
        pool = self._pool
        healthy = pool.healthy
        # No batch is calling the model to find out when it is back, or an endpoint out of a
        # pool that still serves gets no batches (they go to the others): the batcher asks
        # it itself, whenever its breaker would let a probe through.
        wanted = healthy or batches_in_flight == 0
        if wanted and pool.probe_due and (self._probe is None or self._probe.done()):
            self._probe = asyncio.create_task(pool.probe(), name="brimful-probe")
            self._probe.add_done_callback(lambda _: self._wake())
        if not healthy and not self.paused:
            self.paused = True
            self._consumer.pause(*[state.tp for state in self._partitions.values()])
            log.warning("model unreachable: consumption paused", extra={"partitions": sorted(self._partitions)})
        elif healthy and self.paused:
            self.paused = False
            self._consumer.resume(*[state.tp for state in self._partitions.values() if not state.paused])
            log.info("model reachable again: consumption resumed", extra={"partitions": sorted(self._partitions)})

    def endpoint_down(self, url: str) -> None:
        """News that another batcher opened ``url``'s circuit: open it here too, and wake
        the loop, which probes it while it is open (asleep with nothing to do, it would not
        look until the next record arrived)."""
        if self._pool.trip(url):
            self._wake()

    def slots_stalled_s(self, now: float) -> float:
        """How long rows have waited here while no model slot was taken or given back (0
        when none waits, or while the model is out: an outage is not a stall). Calls are
        bounded by their timeout, so slots that stand still while rows wait are wedged."""
        arrivals = [s.accumulator.oldest_arrival for s in self._partitions.values()]
        waiting = [arrived for arrived in arrivals if arrived is not None]
        if not waiting or not self._pool.healthy:
            return 0.0
        return max(0.0, now - max(min(waiting), self._pool.moved_at))
