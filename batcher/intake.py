"""Intake: fetched records become rows waiting in their partition's queues.

Records are accepted in the same step ``getmany`` returns them, with no await in between:
aiokafka returns only records of the current assignment, so no rebalance can slip between
the fetch and the bookkeeping. A fetch is taken up to a gap in the offsets that may still
fill (``offsets.first_gap``); a record that is not a TaskRequest goes to the DLQ; a
partition that holds all the rows it may has its fetching paused. ``until_done`` runs a
batch's work (and the intake's own steps) until it completes, whatever it meets on the way."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import ConsumerStoppedError
from aiokafka.structs import ConsumerRecord
from google.protobuf.message import DecodeError

from brimful.batcher.accumulator import Pending
from brimful.batcher.limits import BatcherLimits
from brimful.batcher.partition_state import OffsetTracker, PartitionState, WaitingRows, first_gap
from brimful.core import metrics
from brimful.core.clock import now_ms
from brimful.core.fetch_pacer import FetchPacer
from brimful.schemas import TaskRequest
from brimful.workers.batch import BatchItem
from brimful.workers.dead_letters import DeadLetterWriter, dead_letter
from brimful.workers.retry_policy import BatchRetryPolicy

log = logging.getLogger("brimful.batcher")

UPSTREAM_ALPHA = 0.05  # weight of each row in the submit-to-fetch EWMA (a half-life of ~14 rows)


@dataclass
class Estimates:
    """Times measured around batches, that the policy plans with."""

    # Flush to stored result, so a row with its own deadline leaves early enough: an EWMA
    # of measured batch durations.
    service: float = 0.05
    # Submit to fetch (the API's write and the Kafka hop): an EWMA over rows. With the
    # service estimate it tells the policy how much of the latency target is spent around a
    # batch rather than in it.
    upstream: float = 0.0


class Intake:
    """Fetches records and queues their rows (see the module's docstring)."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        partitions: dict[int, PartitionState],
        waiting: WaitingRows,
        estimates: Estimates,
        limits: BatcherLimits,
        dead_letters: DeadLetterWriter,
        retry: BatchRetryPolicy,
        clock: Callable[[], float],
        wake: Callable[[], None],
        finish_offsets: Callable[[PartitionState, list[int]], None],
        on_arrival: Callable[[int, float], None] | None = None,
        fetch_pacer: FetchPacer | None = None,
        keep_trace_context: bool = False,
    ) -> None:
        """``wake``: tell the loop there is work; ``finish_offsets``: offsets whose work is
        stored (an undecodable record's, once its letter is written); ``on_arrival``:
        (partition, wall-clock seconds), for trace recording; ``keep_trace_context``:
        records' headers travel with their rows (tracing on)."""
        self._consumer = consumer
        self._partitions = partitions
        self._waiting = waiting
        self._estimates = estimates
        self._limits = limits
        self._dead_letters = dead_letters
        self._retry = retry
        self._clock = clock
        self._wake = wake
        self._finish_offsets = finish_offsets
        self._on_arrival = on_arrival
        self._fetch_pacer = fetch_pacer  # lengthens fetch waits while lagging behind a slow broker
        self._keep_trace_context = keep_trace_context
        self.last_fetch_at: float | None = None  # when a fetch last came back (liveness)

    async def fetch_loop(self) -> None:
        """Fetch and accept until cancelled or the consumer is stopped (then it raises); a
        failed fetch is tried again."""
        while True:
            try:
                fetched = await self._consumer.getmany(timeout_ms=1000)
            except (asyncio.CancelledError, ConsumerStoppedError):
                raise  # a stopped consumer never fetches again: retrying would spin for ever
            except Exception:
                log.exception("fetch failed; retrying")
                await asyncio.sleep(0.5)
                continue
            self.last_fetch_at = self._clock()
            if fetched:
                self.accept(fetched)
                self._wake()
            if self._fetch_pacer is not None:
                await self._fetch_pacer.after_fetch(fetched)

    def full(self, state: PartitionState, share: float = 1.0) -> bool:
        """Whether the partition holds ``share`` of the rows it may (all: its fetching
        pauses; half: it may resume)."""
        return (
            len(state.accumulator) >= self._limits.max_pending_per_partition * share
            or len(state.low) >= self._limits.max_low_pending_per_partition * share
        )

    def accept(self, fetched: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        """Queue the rows of a fetch (of partitions still assigned)."""
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
            arrived: list[Pending[BatchItem]] = []  # the partition's normal rows of this fetch, in order
            try:
                for record in records:
                    if state.tracker is None:
                        state.tracker = OffsetTracker(record.offset)
                    if state.tracker.receive(record.offset):
                        row = self._arrival(state, record, now, wall_ns)
                        if row is not None:
                            arrived.append(row)
            finally:  # what was received is queued, whatever stopped the loop
                state.accumulator.add_many(arrived, now)
            if self.full(state) and not state.paused:
                self._consumer.pause(tp)
                state.paused = True

    def _arrival(
        self, state: PartitionState, record: ConsumerRecord, now: float, wall_ns: int
    ) -> Pending[BatchItem] | None:
        """One received record as a row: the normal row to queue in its accumulator, or
        None for a low-priority row (queued here) or an undecodable record (sent to the DLQ)."""
        try:
            request = TaskRequest.FromString(record.value)
        except (DecodeError, TypeError) as error:  # TypeError: a record with no value
            task = asyncio.create_task(self._dead_letter_undecodable(state, record, error))
            state.in_flight.add(task)
            task.add_done_callback(functools.partial(self._letter_written, state))
            return None
        wall_ms = wall_ns // 1_000_000
        estimates = self._estimates
        flush_by = None
        if request.deadline_at_ms:
            flush_by = now + (request.deadline_at_ms - wall_ms) / 1000 - estimates.service
        stamp = record.timestamp / 1000 if record.timestamp and record.timestamp > 0 else None
        headers = tuple(record.headers) if self._keep_trace_context and record.headers else ()
        item = BatchItem(request, state.tp.partition, record.offset, headers, wall_ns)
        self._waiting.add(item.task_id, state.tp.partition)
        if request.submitted_at_ms:
            estimates.upstream += UPSTREAM_ALPHA * (item.upstream_s - estimates.upstream)
        if self._on_arrival is not None:
            self._on_arrival(state.tp.partition, wall_ms / 1000)
        if request.low_priority:
            state.low.add(item, now, stamp)
            return None
        return Pending(item, now, flush_by, stamp)

    def _readable(
        self, state: PartitionState, tp: TopicPartition, records: list[ConsumerRecord], now: float
    ) -> list[ConsumerRecord]:
        """The records of this fetch up to a gap in the offsets that may still fill; from
        there the partition is read again. Past ``gap_patience_s`` the gap is taken as real."""
        first = records[0].offset if records else 0
        count, missing = first_gap(
            [record.offset for record in records], state.tracker.gap_before(first) if state.tracker else None
        )
        if missing is None:
            return records
        if state.gaps.keep_reading(missing, now):
            self._consumer.seek(tp, missing)
            metrics.OFFSET_GAPS_REREAD.labels(str(tp.partition)).inc()
            return records[:count]
        log.warning("offsets skipped: a real gap", extra={"partition": tp.partition, "first_skipped": missing})
        return records

    def _letter_written(self, state: PartitionState, task: asyncio.Task[None]) -> None:
        # It held one of the partition's in-flight places: the loop must look again, or rows
        # fetched meanwhile wait for the next fetch to wake it.
        state.in_flight.discard(task)
        self._wake()

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
        await until_done(
            f"undecodable-{record.offset}",
            lambda: self._dead_letters.write([letter]),
            lambda e: self._dead_letters.write([letter]),
            self._retry,
            self._limits.store_retry_s,
        )
        log.error("undecodable request sent to the DLQ", extra={"task_id": task_id, "offset": record.offset})
        self._finish_offsets(state, [record.offset])


async def until_done(
    batch_id: str,
    work: Callable[[], Awaitable[object]],
    give_up: Callable[[BaseException], Awaitable[object]],
    retry: BatchRetryPolicy,
    give_up_retry_s: float,
) -> None:
    """Run ``work`` until it completes: through an outage of Redis or the broker by waiting
    it out (its offsets stay uncommitted and repeating it is safe), and past a fault that
    repeating will not mend by ``give_up`` (failing its tasks to the DLQ; retried every
    ``give_up_retry_s``), so no batch can hold its partition for ever."""
    failures = 0
    while True:
        try:
            await work()
            return
        except asyncio.CancelledError:
            raise
        except Exception as error:
            failures += 1
            delay = retry.after_run_failure(error, failures)
            if delay is None:
                log.exception("batch keeps failing; giving it up to the DLQ", extra={"batch_id": batch_id})
                work, delay = functools.partial(give_up, error), give_up_retry_s
            else:
                log.exception("batch could not be finished; retrying", extra={"batch_id": batch_id})
            await asyncio.sleep(delay)
