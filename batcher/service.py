"""The live batcher: a consumer-group member with one accumulator per assigned partition.

One loop owns all state. It waits for whichever comes first: fetched records, the
nearest flush deadline, a finished batch, or the stop signal; then it adds records to
their accumulators and dispatches every batch that is due, within the in-flight bounds
and the free slots of the model pool. The policy plans with the pool's capacity, so a
batch keeps filling while every slot is busy and leaves when one frees.
Finished batches advance their partition's OffsetTracker, and a committer task commits
the safe offsets, so a crash can only cause redelivery, never a skipped task.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata
from google.protobuf.message import DecodeError

from brimful.batcher.accumulator import Accumulator, Pending
from brimful.batcher.backfill import LowPriorityQueue, backfill_due
from brimful.batcher.offsets import GapPatience, OffsetTracker
from brimful.batcher.policy import FlushReason, WaitOrFullPolicy
from brimful.core import metrics
from brimful.core.clock import now_ms
from brimful.core.fetch_pacer import FetchPacer
from brimful.core.policy_params import PolicyParams
from brimful.core.pool_capacity import PoolCapacity
from brimful.schemas import TaskRequest
from brimful.workers.batch import Batch, BatchItem
from brimful.workers.batch_runner import BatchRunner
from brimful.workers.dead_letters import DeadLetterWriter, dead_letter
from brimful.workers.model_pool import Slot

log = logging.getLogger("brimful.batcher")

UPSTREAM_ALPHA = 0.05  # weight of each row in the submit-to-fetch EWMA (a half-life of ~14 rows)
UPSTREAM_SAMPLE_MAX_S = 1.0
BACKFILL_LOOK_S = 0.05  # how often low-priority rows look for a slot while normal rows have none waiting


def upstream_seconds(item: BatchItem) -> float:
    """A row's submit-to-fetch time (the API's write and the Kafka hop), bounded: a skewed
    clock or a backlog's old rows must not blind an estimate built on it for long."""
    if not item.request.submitted_at_ms:
        return 0.0
    return min(max(0.0, item.arrived_ns / 1e9 - item.request.submitted_at_ms / 1000), UPSTREAM_SAMPLE_MAX_S)


@dataclass(frozen=True)
class BatcherLimits:
    """Bounds on work held by one batcher process."""

    max_in_flight: int = 8
    max_in_flight_per_partition: int = 2
    max_pending_per_partition: int = 512
    max_low_pending_per_partition: int = 20000
    commit_timeout_s: float = 5.0
    commit_every_s: float = 0.1  # commits of batches finishing within this go as one
    # How long after a batch's results are stored its offsets may be committed: a Redis
    # that syncs its log every second can lose that much to a kill, and the records of
    # what it lost must be read again (their tasks are re-created and computed).
    commit_after_stored_s: float = 0.0
    revoke_wait_s: float = 2.0
    shutdown_wait_s: float = 30.0
    store_retry_s: float = 0.5
    # How long a gap in a partition's offsets is read again before it counts as real
    # (batcher/offsets.py): the embedded broker's unreadable records become readable within
    # milliseconds; on Apache Kafka a real gap (compaction, transaction markers) costs this once.
    gap_patience_s: float = 1.0


@dataclass
class PartitionState:
    """Everything the batcher holds for one assigned partition."""

    tp: TopicPartition
    accumulator: Accumulator[BatchItem]
    gaps: GapPatience  # how long a gap in its offsets is read again
    tracker: OffsetTracker | None = None  # created at the first record: its offset is the start
    committed: int = -1
    in_flight: set[asyncio.Task[None]] = field(default_factory=set)
    paused: bool = False
    fetched_to: int = -1  # offset after the last record fetched; -1: none yet
    fetched_stamp: float | None = None  # produce time (wall-clock s) of the last record fetched
    # Low-priority rows: they top up this partition's batches and fill idle slots.
    low: LowPriorityQueue[BatchItem] = field(default_factory=LowPriorityQueue)

    def _finished_to(self) -> int | None:
        """The offset before which every record is finished here; None before the first fetch."""
        if self.tracker is not None:
            return self.tracker.safe_to_commit
        return self.committed if self.committed >= 0 else None

    def lag_rows(self, highwater: int) -> int:
        """Records not yet finished (0 until this batcher has fetched from the partition)."""
        finished = self._finished_to()
        return 0 if finished is None else max(0, highwater - finished)

    def lag_seconds(self, highwater: int, now: float, wall_now: float) -> float:
        """How far behind the head in time: the oldest waiting row's age, or while records
        wait unfetched in the broker, the age of the last one fetched (the next is younger,
        so this bounds it from above); 0 when caught up."""
        oldest = self.accumulator.oldest_arrival
        waiting = now - oldest if oldest is not None else 0.0
        unfetched = 0.0
        finished = self._finished_to()
        if finished is not None and highwater > max(self.fetched_to, finished) and self.fetched_stamp is not None:
            unfetched = wall_now - self.fetched_stamp
        return max(0.0, waiting, unfetched)


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, service: BatcherService) -> None:
        self._service = service

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self._service.revoke(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self._service.assign(assigned)


class BatcherService:
    """Consumes the requests topic and runs wait-or-full batches through a BatchRunner."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        topic: str,
        runner: BatchRunner,
        dead_letters: DeadLetterWriter,
        params: PolicyParams,
        limits: BatcherLimits,
        clock: Callable[[], float] = time.monotonic,
        on_arrival: Callable[[int, float], None] | None = None,
        fetch_pacer: FetchPacer | None = None,
        keep_trace_context: bool = False,
    ) -> None:
        self._consumer = consumer
        self._keep_trace_context = keep_trace_context  # tracing on: records' headers travel with their rows
        self._fetch_pacer = fetch_pacer  # lengthens fetch waits while lagging behind a slow broker
        self._topic = topic
        self._runner = runner
        self._dead_letters = dead_letters
        self._params = params
        self._export_params()
        self._limits = limits
        self._clock = clock
        self._on_arrival = on_arrival  # (partition, wall-clock seconds): trace recording
        # Expected time from flush to stored result, so a row with its own deadline
        # leaves early enough; an EWMA of measured batch durations.
        self._service_estimate = 0.05
        # Submit-to-fetch time of the rows read (the API's write and the Kafka hop): an EWMA
        # over rows. With the service estimate it tells the policy how much of the latency
        # target is spent around a batch rather than in it.
        self._upstream = 0.0
        self._partitions: dict[int, PartitionState] = {}
        self._in_flight_total = 0
        self._paused_for_outage = False  # all partitions paused while the model is unreachable
        self._probe: asyncio.Task[None] | None = None
        self._wakeup = asyncio.Event()
        self._commit_wanted = asyncio.Event()
        # Rows waiting here (normal or low priority), by task id -> partition: a cancel of
        # a task this batcher does not hold costs a lookup, not a scan.
        self._waiting: dict[str, int] = {}
        self._cancelled: set[str] = set()  # held here, to leave at the loop's next turn
        self.running = False  # consuming: joined the group and fetching
        self.last_fetch_at: float | None = None  # when the fetch loop last came back (liveness)

    # --- assignment ------------------------------------------------------------------

    def assign(self, assigned: list[TopicPartition]) -> None:
        for tp in assigned:
            if tp.partition not in self._partitions:
                self._partitions[tp.partition] = PartitionState(
                    tp, Accumulator(WaitOrFullPolicy(self._params)), GapPatience(self._limits.gap_patience_s)
                )
        metrics.ASSIGNED_PARTITIONS.set(len(self._partitions))
        log.info("partitions assigned", extra={"partitions": sorted(self._partitions)})
        self._wakeup.set()

    async def revoke(self, revoked: list[TopicPartition]) -> None:
        """Give partitions up: drop what has not been dispatched (the next owner reads it
        again from the committed offset), let in-flight batches finish briefly, commit."""
        states = [self._partitions.pop(tp.partition) for tp in revoked if tp.partition in self._partitions]
        metrics.ASSIGNED_PARTITIONS.set(len(self._partitions))
        for state in states:  # another batcher reports these now
            metrics.forget_partition(str(state.tp.partition))
        for state in states:
            dropped = state.accumulator.drain() + state.low.drain()
            for row in dropped:
                self._waiting.pop(row.item.task_id, None)
            if dropped:
                log.info("released undispatched rows", extra={"partition": state.tp.partition, "rows": len(dropped)})
        in_flight = [task for state in states for task in state.in_flight]
        if in_flight:
            await asyncio.wait(in_flight, timeout=self._limits.revoke_wait_s)
        await self._commit(states)
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
        partitions: dict[str, dict[str, float | int]] = {}
        for number, state in sorted(self._partitions.items()):
            accumulator = state.accumulator
            rate = accumulator.effective_rate(now)
            plan = accumulator.plan(now, capacity)
            oldest = accumulator.oldest_arrival
            budget = 0.0 if plan is None or oldest is None else max(0.0, plan.at - oldest)
            highwater = self._consumer.highwater(state.tp) or 0
            lag_s = state.lag_seconds(highwater, now, wall_now)
            partitions[str(number)] = {
                "arrival_rate": round(rate, 3),
                "wait_budget_s": round(budget, 4),
                "pending": len(accumulator),
                "low_pending": len(state.low),
                "patient": accumulator.patient,
                "in_flight": len(state.in_flight),
                "committed": state.committed,
                "highwater": highwater,
                "lag_s": round(lag_s, 3),
            }
            label = str(number)
            metrics.ARRIVAL_RATE.labels(label).set(rate)
            metrics.FLUSH_DEADLINE.labels(label).set(budget if len(accumulator) else 0.0)
            metrics.PENDING_ROWS.labels(label).set(len(accumulator))
            metrics.CONSUMER_LAG_ROWS.labels(label).set(state.lag_rows(highwater))
            metrics.CONSUMER_LAG_SECONDS.labels(label).set(lag_s)
        return {
            "topic": self._topic,
            "partitions": partitions,
            "paused_for_outage": self._paused_for_outage,
            "in_flight": self._in_flight_total,
            "service_estimate_s": round(self._service_estimate, 4),
            "upstream_estimate_s": round(self._upstream, 4),
            "pool": {
                "free_slots": capacity.free_slots,
                "next_free_in_s": round(capacity.next_free_in, 4),
                "call_s": round(capacity.call_time, 4),
                "around_call_s": round(capacity.around_call, 4),
            },
            "endpoints": self._runner.pool.summary(),
        }

    def seconds_since_fetch(self) -> float | None:
        """How long ago the fetch loop last came back, on this service's clock (liveness);
        None before its first fetch."""
        return None if self.last_fetch_at is None else self._clock() - self.last_fetch_at

    def slots_stalled_s(self) -> float:
        """How long rows have waited here while no model slot was taken or given back (0
        when none waits, or while the model is out: an outage is not a stall). Calls are
        bounded by their timeout, so slots that stand still while rows wait are wedged."""
        arrivals = [s.accumulator.oldest_arrival for s in self._partitions.values()]
        waiting = [arrived for arrived in arrivals if arrived is not None]
        pool = self._runner.pool
        if not waiting or not pool.healthy:
            return 0.0
        return max(0.0, self._clock() - max(min(waiting), pool.moved_at))

    def _export_params(self) -> None:
        metrics.POLICY_LATENCY_TARGET.set(self._params.latency_target)
        metrics.POLICY_MAX_WAIT.set(self._params.max_wait)

    def _capacity(self) -> PoolCapacity:
        """The model pool as the policy should plan with it: with the time a task spends
        before reaching this batcher and after its call, so the latency target holds from
        submit to result."""
        capacity = self._runner.pool.capacity()
        after_call = max(0.0, self._service_estimate - capacity.call_time)
        return replace(capacity, around_call=self._upstream + after_call)

    def endpoint_down(self, url: str) -> None:
        """News that another batcher opened ``url``'s circuit: open it here too, and wake
        the loop, which probes it while it is open (asleep with nothing to do, it would not
        look until the next record arrived)."""
        if self._runner.pool.trip(url):
            self._wakeup.set()

    def cancel(self, task_id: str) -> bool:
        """Drop a task cancelled while it waits here, so its slot goes to the next row;
        False when it does not wait here (a lookup). The rows cancelled meanwhile leave
        together at the loop's next turn, one pass over each queue that holds any, so a
        flood of cancels costs a pass per turn, not a scan per cancel. (A task cancelled
        after its batch left is kept from the model by the store.)"""
        if task_id not in self._waiting:
            return False
        self._cancelled.add(task_id)
        self._wakeup.set()
        return True

    def _drop_cancelled(self) -> None:
        by_partition: dict[int, set[str]] = {}
        for task_id in self._cancelled:
            number = self._waiting.pop(task_id, None)
            if number is not None:
                by_partition.setdefault(number, set()).add(task_id)
        self._cancelled.clear()
        for number, task_ids in by_partition.items():
            state = self._partitions.get(number)
            if state is None:
                continue
            removed = state.accumulator.remove(lambda item: item.task_id in task_ids)  # noqa: B023 (called here)
            removed += state.low.remove(lambda item: item.task_id in task_ids)  # noqa: B023 (called here)
            if state.tracker is not None:
                for row in removed:
                    state.tracker.finish(row.item.offset)
            for row in removed:
                log.debug("cancelled task left its batch", extra={"task_id": row.item.task_id, "partition": number})
            log.info("cancelled tasks left their batches", extra={"partition": number, "tasks": len(removed)})
        if by_partition:
            self._commit_wanted.set()

    # --- main loop ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set, then flush what waits and drain in-flight work."""
        self._consumer.subscribe([self._topic], listener=_Rebalance(self))
        committer = asyncio.create_task(self._commit_loop(), name="brimful-committer")
        fetcher = asyncio.create_task(self._fetch_loop(), name="brimful-fetcher")
        stop_wait = asyncio.create_task(stop.wait())
        self.running = True
        try:
            while not stop.is_set():
                wake = asyncio.create_task(self._wakeup.wait())
                timeout = self._seconds_to_next_flush()
                if self._paused_for_outage or self._runner.pool.some_circuit_open:
                    timeout = 0.25 if timeout is None else min(timeout, 0.25)  # watch for recovery
                await asyncio.wait({wake, stop_wait, fetcher}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                wake.cancel()
                self._wakeup.clear()
                if fetcher.done():
                    fetcher.result()  # the fetch loop only ends by raising: surface it
                self._follow_model_health()
                self._dispatch_due()
        finally:
            self.running = False
            fetcher.cancel()
            stop_wait.cancel()
            await self._shutdown()
            committer.cancel()

    async def _fetch_loop(self) -> None:
        # Records are accepted in the same step getmany returns them, with no await in
        # between: aiokafka returns only records of the current assignment, so no
        # rebalance can slip between the fetch and the bookkeeping.
        while True:
            try:
                fetched = await self._consumer.getmany(timeout_ms=1000)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("fetch failed; retrying")
                await asyncio.sleep(0.5)
                continue
            self.last_fetch_at = self._clock()
            if fetched:
                self._accept(fetched)
                self._wakeup.set()
            if self._fetch_pacer is not None:
                await self._fetch_pacer.after_fetch(fetched)

    def _seconds_to_next_flush(self) -> float | None:
        now = self._clock()
        capacity = self._capacity()
        nearest: float | None = None
        for state in self._partitions.values():
            if not self._has_slot(state):
                continue  # a finished batch wakes the loop
            plan = state.accumulator.plan(now, capacity)
            wakes = [] if plan is None else [plan.at]
            if len(state.low):
                wakes.append(state.low.next_promotion(self._params.low_max_wait))  # type: ignore[arg-type]
                if not len(state.accumulator):
                    wakes.append(now + BACKFILL_LOOK_S)  # a backfill waits for the normal rate to fall
            if wakes and (nearest is None or min(wakes) < nearest):
                nearest = min(wakes)
        return None if nearest is None else max(0.0, nearest - now)

    def _accept(self, fetched: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        now = self._clock()
        wall_ns = time.time_ns()
        wall_ms = wall_ns // 1_000_000
        for tp, records in fetched.items():
            state = self._partitions.get(tp.partition)
            if state is None:
                continue
            records = self._readable(state, tp, records, now)
            if records:
                state.fetched_to = max(state.fetched_to, records[-1].offset + 1)
                last = records[-1].timestamp
                state.fetched_stamp = last / 1000 if last and last > 0 else wall_ms / 1000
            for record in records:
                if state.tracker is None:
                    state.tracker = OffsetTracker(record.offset)
                if not state.tracker.receive(record.offset):
                    continue
                try:
                    request = TaskRequest.FromString(record.value)
                except (DecodeError, TypeError) as error:  # TypeError: a record with no value
                    task = asyncio.create_task(self._dead_letter_undecodable(state, record, error))
                    state.in_flight.add(task)
                    task.add_done_callback(functools.partial(self._letter_written, state))
                    continue
                flush_by = None
                if request.deadline_at_ms:
                    flush_by = now + (request.deadline_at_ms - wall_ms) / 1000 - self._service_estimate
                stamp = record.timestamp / 1000 if record.timestamp and record.timestamp > 0 else None
                headers = tuple(record.headers) if self._keep_trace_context and record.headers else ()
                item = BatchItem(request, tp.partition, record.offset, headers, wall_ns)
                self._waiting[request.task_id] = tp.partition
                if request.submitted_at_ms:
                    self._upstream += UPSTREAM_ALPHA * (upstream_seconds(item) - self._upstream)
                if request.low_priority:
                    state.low.add(item, now, stamp)
                else:
                    state.accumulator.add(item, now, flush_by, stamp)
                if self._on_arrival is not None:
                    self._on_arrival(tp.partition, wall_ms / 1000)
            if self._full(state) and not state.paused:
                self._consumer.pause(tp)
                state.paused = True

    def _readable(
        self, state: PartitionState, tp: TopicPartition, records: list[ConsumerRecord], now: float
    ) -> list[ConsumerRecord]:
        """The records of this fetch up to a gap in the offsets that may still fill: from
        there the partition is read again (a skipped record would never be read, and the
        commit would pass it). Past ``gap_patience_s`` the gap is taken as real."""
        if not records:
            return records
        first = records[0].offset
        expected = state.tracker.gap_before(first) if state.tracker is not None else None
        if expected is not None:  # between the last fetch and this one
            kept: list[ConsumerRecord] = []
        elif records[-1].offset - first + 1 == len(records):  # contiguous: the common case
            return records
        else:  # within this fetch (its offsets rise)
            index = next(i for i in range(1, len(records)) if records[i].offset > records[i - 1].offset + 1)
            expected, kept = records[index - 1].offset + 1, records[:index]
        if state.gaps.keep_reading(expected, now):
            self._consumer.seek(tp, expected)
            metrics.OFFSET_GAPS_REREAD.labels(str(tp.partition)).inc()
            return kept
        log.warning("offsets skipped: a real gap", extra={"partition": tp.partition, "first_skipped": expected})
        return records

    def _follow_model_health(self) -> None:
        """Pause every partition while the model's circuit is open, so an outage costs
        neither retries nor dead letters; resume by itself once it closes."""
        pool = self._runner.pool
        healthy = pool.healthy
        # No batch is calling the model to find out when it is back, or an endpoint out of a
        # pool that still serves gets no batches (they go to the others): the batcher asks
        # it itself, whenever its breaker would let a probe through (the loop looks again
        # every 0.25 s while a circuit is open).
        wanted = healthy or self._in_flight_total == 0
        if wanted and pool.probe_due and (self._probe is None or self._probe.done()):
            self._probe = asyncio.create_task(pool.probe(), name="brimful-probe")
            self._probe.add_done_callback(lambda _: self._wakeup.set())
        if not healthy and not self._paused_for_outage:
            self._paused_for_outage = True
            self._consumer.pause(*[state.tp for state in self._partitions.values()])
            log.warning("model unreachable: consumption paused", extra={"partitions": sorted(self._partitions)})
        elif healthy and self._paused_for_outage:
            self._paused_for_outage = False
            self._consumer.resume(*[state.tp for state in self._partitions.values() if not state.paused])
            log.info("model reachable again: consumption resumed", extra={"partitions": sorted(self._partitions)})

    def _full(self, state: PartitionState, share: float = 1.0) -> bool:
        """Whether the partition holds ``share`` of the rows it may (all: its fetching
        pauses; half: it may resume)."""
        return (
            len(state.accumulator) >= self._limits.max_pending_per_partition * share
            or len(state.low) >= self._limits.max_low_pending_per_partition * share
        )

    def _has_slot(self, state: PartitionState) -> bool:
        return (
            not self._paused_for_outage
            and self._in_flight_total < self._limits.max_in_flight
            and len(state.in_flight) < self._limits.max_in_flight_per_partition
        )

    def _dispatch_due(self, force_reason: FlushReason | None = None) -> None:
        if self._cancelled:
            self._drop_cancelled()
        now = self._clock()
        pool = self._runner.pool
        batch_size = self._params.batch_size
        for state in self._partitions.values():
            promoted = state.low.overdue(now, self._params.low_max_wait)
            if promoted:  # waited their bound: from now on they queue as normal rows
                state.accumulator.admit_promoted(promoted)
                log.info("low-priority rows promoted", extra={"partition": state.tp.partition, "rows": len(promoted)})
        capacity = self._capacity()
        # Oldest waiting rows first, so one busy partition cannot starve the others.
        states = sorted(
            (s for s in self._partitions.values() if len(s.accumulator)),
            key=lambda s: s.accumulator.plan(now, capacity).at,  # type: ignore[union-attr]
        )
        for state in states:
            while len(state.accumulator) and self._has_slot(state):
                reason = force_reason or state.accumulator.due(now, self._capacity())
                if reason is None:
                    break
                slot = pool.reserve(min(len(state.accumulator) + len(state.low), batch_size))
                if slot is None:
                    break  # every slot is busy: the batch keeps filling until one frees
                rows = state.accumulator.take()
                rows += state.low.take(batch_size - len(rows))  # slots that would be padding carry bulk work
                self._start_batch(state, rows, reason, slot)
        if force_reason is None:
            for state in self._partitions.values():
                while self._has_slot(state) and backfill_due(
                    len(state.accumulator),
                    state.accumulator.effective_rate(now),
                    self._params.latency_target,
                    len(state.low),
                ):
                    slot = pool.reserve(min(len(state.low), batch_size))
                    if slot is None:
                        break
                    self._start_batch(state, state.low.take(batch_size), FlushReason.BACKFILL, slot)
        for state in self._partitions.values():
            if state.paused and not self._full(state, share=0.5):
                state.paused = False
                if not self._paused_for_outage:
                    self._consumer.resume(state.tp)

    def _start_batch(
        self, state: PartitionState, rows: list[Pending[BatchItem]], reason: FlushReason, slot: Slot
    ) -> None:
        now = self._clock()
        label = str(state.tp.partition)
        metrics.FLUSHES.labels(label, reason.value).inc()
        waited_total = upstream_total = 0.0
        queue_wait = metrics.QUEUE_WAIT.labels(label)  # looked up once a batch, not once a row
        waiting = self._waiting
        for row in rows:
            waiting.pop(row.item.task_id, None)
            waited = now - row.arrived_at
            queue_wait.observe(waited)
            waited_total += waited
            upstream_total += upstream_seconds(row.item)
        metrics.BATCH_STAGE.labels("to_batcher").observe(upstream_total / len(rows))
        metrics.BATCH_STAGE.labels("in_batch").observe(waited_total / len(rows))
        batch = Batch(
            batch_id=uuid.uuid4().hex,
            partition=state.tp.partition,
            items=[row.item for row in rows],
            reason=reason.value,
            slot=slot,
            flushed_ns=time.time_ns(),
        )
        self._in_flight_total += 1
        task = asyncio.create_task(self._run_batch(state, batch), name=f"batch-{batch.batch_id}")
        state.in_flight.add(task)
        task.add_done_callback(lambda t: self._batch_finished(state, t))

    async def _run_batch(self, state: PartitionState, batch: Batch) -> None:
        started = self._clock()
        await self._until_done(
            batch.batch_id, lambda: self._runner.run(batch), lambda error: self._runner.abandon(batch, error)
        )
        self._service_estimate += 0.2 * ((self._clock() - started) - self._service_estimate)
        self._finish_offsets(state, [item.offset for item in batch.items])

    async def _until_done(
        self,
        batch_id: str,
        work: Callable[[], Awaitable[object]],
        give_up: Callable[[BaseException], Awaitable[object]],
    ) -> None:
        """Run ``work`` until it completes: through an outage of Redis or the broker by
        waiting it out (its offsets stay uncommitted and repeating it is safe), and past a
        fault that repeating will not mend by ``give_up`` (failing its tasks to the DLQ), so
        no batch can hold its partition forever."""
        failures = 0
        while True:
            try:
                await work()
                return
            except asyncio.CancelledError:
                raise
            except Exception as error:
                failures += 1
                delay = self._runner.retry.after_run_failure(error, failures)
                if delay is None:
                    log.exception("batch keeps failing; giving it up to the DLQ", extra={"batch_id": batch_id})
                    work, delay = functools.partial(give_up, error), self._limits.store_retry_s
                else:
                    log.exception("batch could not be finished; retrying", extra={"batch_id": batch_id})
                await asyncio.sleep(delay)

    def _finish_offsets(self, state: PartitionState, offsets: list[int]) -> None:
        if state.tracker is not None:
            for offset in offsets:
                state.tracker.finish(offset)
        self._commit_wanted.set()

    def _letter_written(self, state: PartitionState, task: asyncio.Task[None]) -> None:
        # It held one of the partition's in-flight places: the loop must look again, or rows
        # fetched meanwhile wait for the next fetch to wake it.
        state.in_flight.discard(task)
        self._wakeup.set()

    def _batch_finished(self, state: PartitionState, task: asyncio.Task[None]) -> None:
        state.in_flight.discard(task)
        self._in_flight_total -= 1
        self._wakeup.set()

    async def _dead_letter_undecodable(self, state: PartitionState, record: ConsumerRecord, error: Exception) -> None:
        task_id = record.key.decode(errors="replace") if record.key else ""
        letter = dead_letter(
            TaskRequest(task_id=task_id),
            "undecodable",
            f"request is not a valid TaskRequest: {error}",
            record.partition,
            record.offset,
            now_ms(),
            raw_request=record.value or b"",
        )
        # Its offset is finished only once the letter is written: retried through outages.
        await self._until_done(
            f"undecodable-{record.offset}",
            lambda: self._dead_letters.write([letter]),
            lambda e: self._dead_letters.write([letter]),
        )
        log.error("undecodable request sent to the DLQ", extra={"task_id": task_id, "offset": record.offset})
        self._finish_offsets(state, [record.offset])

    # --- commits -----------------------------------------------------------------------

    async def _commit_loop(self) -> None:
        while True:
            await self._commit_wanted.wait()
            self._commit_wanted.clear()
            states = list(self._partitions.values())
            finished = {state.tp: state.tracker.safe_to_commit for state in states if state.tracker is not None}
            if self._limits.commit_after_stored_s > 0:
                # What finished by now is durable in Redis once this passes; what finishes
                # meanwhile waits for the next round.
                await asyncio.sleep(self._limits.commit_after_stored_s)
            assigned = [state for state in states if self._partitions.get(state.tp.partition) is state]
            await self._commit(assigned, finished)
            await asyncio.sleep(self._limits.commit_every_s)  # the commits of batches finishing meanwhile go as one

    async def _commit(self, states: list[PartitionState], upto: dict[TopicPartition, int] | None = None) -> None:
        """Commit each partition's finished offsets (``upto``: no further than these)."""
        offsets = {
            state.tp: OffsetAndMetadata(safe, "")
            for state in states
            if state.tracker is not None
            and (safe := min(state.tracker.safe_to_commit, (upto or {}).get(state.tp, state.tracker.safe_to_commit)))
            > state.committed
        }
        if not offsets:
            return
        try:
            # Bounded: a broker that lost the topic can make commit() retry forever.
            await asyncio.wait_for(self._consumer.commit(offsets), timeout=self._limits.commit_timeout_s)
        except Exception as error:
            log.warning("offset commit failed; will retry", extra={"error": repr(error)})
            self._commit_wanted.set()
            return
        for state in states:
            if state.tp in offsets:
                state.committed = offsets[state.tp].offset

    async def _shutdown(self) -> None:
        """Flush every waiting row (reason ``shutdown``), finish in-flight work, commit."""
        deadline = self._clock() + self._limits.shutdown_wait_s
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
        await self._commit(list(self._partitions.values()))
        log.info("batcher stopped")
