"""The live batcher: a consumer-group member with one accumulator per assigned partition.

One loop owns all state. It waits for whichever comes first: fetched records, the
nearest flush deadline, a finished batch, or the stop signal; then it adds records to
their accumulators and dispatches every batch that is due, within the in-flight bounds
and the free slots of the model pool. The policy plans with the pool's capacity, so a
batch keeps filling while every slot is busy and leaves when one frees.
Finished batches advance their partition's OffsetTracker, and the committer
(``batcher/partition_state.py``) commits the safe offsets, so a crash can only cause
redelivery, never a skipped task.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from aiokafka import AIOKafkaConsumer, TopicPartition

from brimful.batcher.accumulator import Accumulator, backfill_due
from brimful.batcher.dispatch import InFlightBatches, ModelHealth, Runner, SlotLeasing
from brimful.batcher.intake import Estimates, Intake
from brimful.batcher.limits import BatcherLimits
from brimful.batcher.partition_state import GapPatience, OffsetCommitter, PartitionState, WaitingRows
from brimful.batcher.policy import FlushReason, WaitOrFullPolicy
from brimful.batcher.rebalance import Rebalance
from brimful.batcher.status_snapshot import partition_status, pool_status
from brimful.core import metrics
from brimful.core.clock import now_ms
from brimful.core.fetch_pacer import FetchPacer
from brimful.core.policy_params import PolicyParams
from brimful.core.pool_capacity import PoolCapacity
from brimful.workers.dead_letters import DeadLetterWriter
from brimful.workers.model_pool import ModelPool
from brimful.workers.retry_policy import BatchRetryPolicy

log = logging.getLogger("brimful.batcher")

BACKFILL_LOOK_S = 0.05  # how often low-priority rows look for a slot while normal rows have none waiting


class BatcherService:
    """Consumes the requests topic and runs wait-or-full batches through a runner."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        topic: str,
        runner: Runner,
        pool: ModelPool,
        retry: BatchRetryPolicy,
        dead_letters: DeadLetterWriter,
        params: PolicyParams,
        limits: BatcherLimits,
        clock: Callable[[], float] = time.monotonic,
        on_arrival: Callable[[int, float], None] | None = None,
        fetch_pacer: FetchPacer | None = None,
        keep_trace_context: bool = False,
    ) -> None:
        self._consumer = consumer
        self._topic = topic
        self._pool = pool
        self._retry = retry
        self._dead_letters = dead_letters
        self._params = params
        self._export_params()
        self._limits = limits
        self._clock = clock
        self._fetch_pacer = fetch_pacer
        self._estimates = Estimates()
        self._partitions: dict[int, PartitionState] = {}
        self._wakeup = asyncio.Event()
        self._committer = OffsetCommitter(
            consumer,
            lambda: self._partitions,
            timeout_s=limits.commit_timeout_s,
            every_s=limits.commit_every_s,
            after_stored_s=limits.commit_after_stored_s,
        )
        self._waiting = WaitingRows()  # rows waiting here (normal or low priority), by task id
        self._in_flight = InFlightBatches(
            runner,
            retry,
            limits.store_retry_s,
            self._waiting,
            self._estimates,
            clock,
            self._committer.want,
            self._wakeup.set,
        )
        self._leasing = SlotLeasing(pool, self._wakeup.set)
        # Pauses consumption through outages; hears other batchers' news of an endpoint down.
        self.health = ModelHealth(pool, consumer, self._partitions, self._wakeup.set)
        self._intake = self._make_intake(on_arrival, keep_trace_context)
        self.running = False  # consuming: joined the group and fetching
        # Per-partition gauges are labelled by partition number: where topics rotate, only
        # the current generation's service sets them.
        self.exports_gauges = True
        self.settled = False  # an assignment came and no rebalance is under way (retiring looks at it)

    def _make_intake(self, on_arrival: Callable[[int, float], None] | None, keep_trace_context: bool) -> Intake:
        """What reads the topic into this service's partitions and waiting rows."""
        return Intake(
            self._consumer,
            self._partitions,
            self._waiting,
            self._estimates,
            self._limits,
            self._dead_letters,
            self._retry,
            self._clock,
            self._wakeup.set,
            self._in_flight.finish_offsets,
            on_arrival=on_arrival,
            fetch_pacer=self._fetch_pacer,
            keep_trace_context=keep_trace_context,
        )

    # --- assignment ------------------------------------------------------------------

    def assign(self, assigned: list[TopicPartition]) -> None:
        self.settled = True
        for tp in assigned:
            if tp.partition not in self._partitions:
                self._partitions[tp.partition] = PartitionState(
                    tp, Accumulator(WaitOrFullPolicy(self._params)), GapPatience(self._limits.gap_patience_s)
                )
        if self.exports_gauges:
            metrics.ASSIGNED_PARTITIONS.set(len(self._partitions))
        log.info("partitions assigned", extra={"partitions": sorted(self._partitions)})
        self._wakeup.set()

    async def revoke(self, revoked: list[TopicPartition]) -> None:
        """Give partitions up: drop what has not been dispatched (the next owner reads it
        again from the committed offset), let in-flight batches finish briefly, commit."""
        self.settled = False
        states = [self._partitions.pop(tp.partition) for tp in revoked if tp.partition in self._partitions]
        for state in states:
            self._leasing.drop(state.tp.partition)
        if self.exports_gauges:
            metrics.ASSIGNED_PARTITIONS.set(len(self._partitions))
            for state in states:  # another batcher reports these now
                metrics.forget_partition(str(state.tp.partition))
        for state in states:
            dropped = state.accumulator.drain() + state.low.drain()
            for row in dropped:
                self._waiting.left(row.item.task_id)
            if dropped:
                log.info("released undispatched rows", extra={"partition": state.tp.partition, "rows": len(dropped)})
        in_flight = [task for state in states for task in state.in_flight]
        if in_flight:
            await asyncio.wait(in_flight, timeout=self._limits.revoke_wait_s)
        await self._committer.commit(states)
        log.info("partitions revoked", extra={"partitions": [tp.partition for tp in revoked]})

    # --- live tuning and status ----------------------------------------------------

    @property
    def params(self) -> PolicyParams:
        return self._params

    def set_params(self, params: PolicyParams) -> None:
        """Adopt new policy parameters; rows already waiting are judged by them at once."""
        self._params = params
        self._export_params()
        for state in self._partitions.values():
            state.accumulator.set_params(params)
        self._wakeup.set()

    def snapshot(self) -> dict[str, object]:
        """What each partition's accumulator is doing now (for metrics and ``brimful stats``)."""
        now = self._clock()
        wall_now = now_ms() / 1000
        capacity = self._capacity()
        highwater = {number: self._consumer.highwater(state.tp) or 0 for number, state in self._partitions.items()}
        return {
            "topic": self._topic,
            "partitions": {
                str(number): partition_status(
                    number, state, highwater[number], capacity, now, wall_now, export=self.exports_gauges
                )
                for number, state in sorted(self._partitions.items())
            },
            "paused_for_outage": self.health.paused,
            "in_flight": self._in_flight.total,
            "service_estimate_s": round(self._estimates.service, 4),
            "upstream_estimate_s": round(self._estimates.upstream, 4),
            "pool": pool_status(capacity),
            "endpoints": self._pool.summary(),
        }

    def seconds_since_fetch(self) -> float | None:
        """How long ago the fetch loop last came back, on this service's clock (liveness);
        None before its first fetch."""
        fetched_at = self._intake.last_fetch_at
        return None if fetched_at is None else self._clock() - fetched_at

    def slots_stalled_s(self) -> float:
        """How long rows have waited while no model slot moved (``ModelHealth``)."""
        return self.health.slots_stalled_s(self._clock())

    def _export_params(self) -> None:
        metrics.POLICY_LATENCY_TARGET.set(self._params.latency_target)
        metrics.POLICY_MAX_WAIT.set(self._params.max_wait)

    def _capacity(self) -> PoolCapacity:
        """The model pool as the policy should plan with it: with the time a task spends
        before reaching this batcher and after its call, so the latency target holds from
        submit to result."""
        capacity = self._pool.capacity()
        after_call = max(0.0, self._estimates.service - capacity.call_time)
        return replace(capacity, around_call=self._estimates.upstream + after_call)

    def pace_fetches(self, wait_ms: int) -> bool:
        """Make ``wait_ms`` the fetch wait while caught up (the pacer still lengthens it for
        a lagging partition); False where it cannot be changed, or the service has no pacer
        (only tests build one so)."""
        return self._fetch_pacer is not None and self._fetch_pacer.set_base(wait_ms)

    def cancel(self, task_id: str) -> bool:
        """Drop a task cancelled while it waits here, so its slot goes to the next row;
        False when it does not wait here (a lookup). The rows cancelled meanwhile leave
        together at the loop's next turn, one pass over each queue that holds any, so a
        flood of cancels costs a pass per turn, not a scan per cancel. (A task cancelled
        after its batch left is kept from the model by the store.)"""
        if not self._waiting.cancel(task_id):
            return False
        self._wakeup.set()
        return True

    # --- main loop ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set, then flush what waits and drain in-flight work."""
        self._consumer.subscribe([self._topic], listener=Rebalance(self))
        committer = asyncio.create_task(self._committer.run(), name="brimful-committer")
        fetcher = asyncio.create_task(self._intake.fetch_loop(), name="brimful-fetcher")
        stop_wait = asyncio.create_task(stop.wait())
        self.running = True
        try:
            while not stop.is_set():
                wake = asyncio.create_task(self._wakeup.wait())
                timeout = self._seconds_to_next_flush()
                if self.health.watching:
                    timeout = 0.25 if timeout is None else min(timeout, 0.25)  # watch for recovery
                await asyncio.wait({wake, stop_wait, fetcher}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                wake.cancel()
                self._wakeup.clear()
                if fetcher.done():
                    fetcher.result()  # the fetch loop only ends by raising: surface it
                self.health.follow(self._in_flight.total)
                self._dispatch_due()
        finally:
            self.running = False
            fetcher.cancel()
            stop_wait.cancel()
            await self._shutdown()
            committer.cancel()

    def _seconds_to_next_flush(self) -> float | None:
        now = self._clock()
        capacity = self._capacity()
        nearest: float | None = None
        for state in self._partitions.values():
            if not self._has_slot(state) or self._leasing.pending(state.tp.partition):
                continue  # a finished batch, or a settled lease, wakes the loop
            plan = state.accumulator.plan(now, capacity)
            wakes = [] if plan is None else [plan.at]
            if len(state.low):
                wakes.append(state.low.next_promotion(self._params.low_max_wait))  # type: ignore[arg-type]
                if not len(state.accumulator):
                    wakes.append(now + BACKFILL_LOOK_S)  # a backfill waits for the normal rate to fall
            if wakes and (nearest is None or min(wakes) < nearest):
                nearest = min(wakes)
        return None if nearest is None else max(0.0, nearest - now)

    def _has_slot(self, state: PartitionState) -> bool:
        return (
            not self.health.paused
            and self._in_flight.total < self._limits.max_in_flight
            and len(state.in_flight) < self._limits.max_in_flight_per_partition
        )

    def _dispatch_due(self, force_reason: FlushReason | None = None) -> None:
        if self._waiting.cancels_waiting and self._waiting.drop_cancelled(self._partitions):
            self._committer.want()  # the cancelled rows' offsets are finished
        now = self._clock()
        self._promote_overdue(now)
        capacity = self._capacity()
        # Oldest waiting rows first, so one busy partition cannot starve the others.
        states = sorted(
            (s for s in self._partitions.values() if len(s.accumulator)),
            key=lambda s: s.accumulator.plan(now, capacity).at,  # type: ignore[union-attr]
        )
        for state in states:
            self._dispatch_partition(state, now, force_reason)
        self._leasing.idle_ready({number for number, state in self._partitions.items() if len(state.accumulator)})
        if force_reason is None:
            self._backfill(now)
        for state in self._partitions.values():
            if state.paused and not self._intake.full(state, share=0.5):
                state.paused = False
                if not self.health.paused:
                    self._consumer.resume(state.tp)

    def _promote_overdue(self, now: float) -> None:
        """Low-priority rows that waited their bound queue as normal rows from now on."""
        for state in self._partitions.values():
            promoted = state.low.overdue(now, self._params.low_max_wait)
            if promoted:
                state.accumulator.admit_promoted(promoted)
                log.info("low-priority rows promoted", extra={"partition": state.tp.partition, "rows": len(promoted)})

    def _dispatch_partition(self, state: PartitionState, now: float, force_reason: FlushReason | None) -> None:
        """Send the partition's batches that are due, while it has a slot and a lease."""
        number = state.tp.partition
        batch_size = self._params.batch_size
        while len(state.accumulator) and self._has_slot(state):
            leased = self._leasing.take_ready(number)
            if leased is not None:
                slot, reason = leased
            else:
                due = force_reason or state.accumulator.due(now, self._capacity())
                if due is None or self._leasing.pending(number):
                    return  # a lease on its way: the batch keeps filling
                reason = due
                reserved = self._pool.reserve(min(len(state.accumulator) + len(state.low), batch_size))
                if reserved is None:
                    return  # every slot is busy: the batch keeps filling until one frees
                if self._pool.leasing and force_reason is None:
                    self._leasing.start(number, reserved, reason)  # rows leave once it is leased
                    return
                slot = reserved
            rows = state.accumulator.take()
            rows += state.low.take(batch_size - len(rows))  # slots that would be padding carry bulk work
            self._in_flight.start(state, rows, reason, slot)

    def _backfill(self, now: float) -> None:
        """Slots no normal row wants carry low-priority work (``batcher/accumulator.py``)."""
        batch_size = self._params.batch_size
        for state in self._partitions.values():
            while self._has_slot(state) and backfill_due(
                len(state.accumulator),
                state.accumulator.effective_rate(now),
                self._params.latency_target,
                len(state.low),
            ):
                backfill = self._pool.reserve(min(len(state.low), batch_size))
                if backfill is None:
                    break
                self._in_flight.start(state, state.low.take(batch_size), FlushReason.BACKFILL, backfill)

    async def _shutdown(self) -> None:
        """Flush every waiting row (reason ``shutdown``), finish in-flight work, commit."""
        deadline = self._clock() + self._limits.shutdown_wait_s
        self._leasing.drop_all()  # a shutdown's batches secure their slots as they go
        while self._clock() < deadline:
            self._dispatch_due(force_reason=FlushReason.SHUTDOWN)
            in_flight = [task for state in self._partitions.values() for task in state.in_flight]
            if not in_flight:
                # Rows left now cannot be dispatched (the model is unreachable): they stay
                # uncommitted, and whoever owns the partition next reads them again.
                left = sum(len(s.accumulator) + len(s.low) for s in self._partitions.values())
                if left:
                    log.warning("rows left undispatched at shutdown", extra={"rows": left})
                break
            await asyncio.wait(
                in_flight, timeout=max(0.0, deadline - self._clock()), return_when=asyncio.FIRST_COMPLETED
            )
        await self._in_flight.stop_overdue([task for state in self._partitions.values() for task in state.in_flight])
        await self._committer.commit(list(self._partitions.values()))
        log.info("batcher stopped")
