"""What the batcher hands the GPU side, and what running it did: the batch types. The
batcher imports these, not the runner.

Many observations of one histogram at once (``observe_all``): prometheus_client observes
one value at a time, a lock and a scan of the buckets each, about 1.3 us. A batcher
observed two histograms a row (a row's wait in its accumulator, a task's submit-to-result
time), 64 times a batch. ``observe_all`` counts a batch's values into the buckets first,
then adds each bucket's count once: the samples exported are the same as those of one
``observe`` a value (``tests/unit/test_observe_all.py``).

Which of a batch's rows go on to run, decided against the task store just before the
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

import asyncio
import logging
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Histogram

from brimful.core import metrics
from brimful.core.clock import now_ms
from brimful.core.task_provenance import CallFacts, StoredProvenance
from brimful.core.task_record import KnownTask
from brimful.core.task_store import TaskStore
from brimful.schemas import TaskRequest
from brimful.workers.slot import Slot

log = logging.getLogger("brimful.worker")

# A row's submit-to-fetch time is bounded: a skewed clock or a backlog's old rows must not
# blind an estimate built on it for long.
UPSTREAM_SAMPLE_MAX_S = 1.0


@dataclass(slots=True)
class BatchItem:
    """One task in a batch, with where it came from. Not changed once made (not frozen: a
    frozen dataclass sets each field through ``object.__setattr__``, and one is made a row)."""

    request: TaskRequest
    partition: int
    offset: int
    trace_headers: tuple[tuple[str, bytes], ...] = ()  # the task's trace context (tracing on)
    arrived_ns: int = 0  # when the batcher fetched it, wall clock
    # The request's, read once: a protobuf field read makes a new str each time, and a
    # row's id is read about ten times on its way through the batcher.
    task_id: str = field(init=False, compare=False, repr=False)
    # Submit (the API's clock) to fetch (the batcher's), in seconds, bounded; 0 when the
    # request has no submission time. Read by the policy's estimate and the stage metric.
    upstream_s: float = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        request = self.request
        self.task_id = request.task_id
        submitted_ms = request.submitted_at_ms
        self.upstream_s = (
            min(max(0.0, self.arrived_ns / 1e9 - submitted_ms / 1000), UPSTREAM_SAMPLE_MAX_S) if submitted_ms else 0.0
        )


@dataclass
class Batch:
    """Rows flushed together from one partition."""

    batch_id: str
    partition: int
    items: list[BatchItem]
    reason: str
    slot: Slot | None = None  # the model slot taken when it was dispatched; used by its first run
    flushed_ns: int = 0  # when it left its accumulator, wall clock


@dataclass
class Seat:
    """The slot a running batch holds while it calls the model (None between calls: its
    Redis and broker work leaves the endpoint to others); a transient failure moves it to
    another endpoint."""

    slot: Slot | None


@dataclass
class BatchOutcome:
    """What running a batch did."""

    done: int = 0
    failed: int = 0
    skipped: int = 0
    expired: int = 0  # deadline passed before the call: never computed
    calls: int = 0
    isolation_calls: int = 0  # calls made on halves to find poison rows
    # Shared counters of the flush and of the calls that went through, not yet in Redis: they
    # go with the batch's results in the same round trip (the tasks done are counted there),
    # or when the batch ends (failures are added at once: an outage shows live).
    stats: Counter[str] = field(default_factory=Counter)
    # The last successful model call, wall clock (for traces).
    call_started_ns: int = 0
    call_ended_ns: int = 0
    endpoint: str = ""
    # The view of identical rows (workers/shared_rows.py): each computed row's key, the
    # identical tasks that share its result (by the computed task's id), and the keys this
    # batch computes for other batches too, with the result they wait on.
    keys: dict[str, bytes] = field(default_factory=dict)
    twins: dict[str, list[BatchItem]] = field(default_factory=dict)
    leading: dict[bytes, asyncio.Future[dict[str, Any] | None]] = field(default_factory=dict)
    # The provenance of the batch's tasks answered with a result it did not compute (the
    # result cache's, another batch's): its own batch, no call. None: provenance is off.
    answered_provenance: StoredProvenance | None = None

    def provenance_of(self, items: Iterable[BatchItem]) -> dict[str, bytes] | None:
        """Each of ``items``' stored provenance as answered without a call of its own, by id."""
        stored = self.answered_provenance
        return None if stored is None else {item.task_id: stored.of(item.arrived_ns) for item in items}


def call_facts(batch: Batch, outcome: BatchOutcome, rows: int, batch_size: int) -> CallFacts:
    """What the batch's last successful call (of ``rows`` real rows) says of its tasks;
    with no call yet (answered from elsewhere), its instants are the flush's."""
    flushed = batch.flushed_ns
    return CallFacts(
        batch_id=batch.batch_id,
        partition=batch.partition,
        flush_reason=batch.reason,
        rows=rows,
        padded_rows=batch_size - rows if rows else 0,
        model_calls=outcome.calls,
        endpoint_url=outcome.endpoint,
        flushed_ns=flushed,
        call_started_ns=outcome.call_started_ns or flushed,
        call_ended_ns=outcome.call_ended_ns or flushed,
    )


def observe_latency(items: list[BatchItem]) -> None:
    """Each task's time from submission to its stored result."""
    finished_ms = now_ms()
    observe_all(metrics.TASK_LATENCY, [max(0, finished_ms - item.request.submitted_at_ms) / 1000 for item in items])


def observe_all(histogram: Histogram, amounts: Iterable[float]) -> None:
    """``histogram.observe`` of each of ``amounts`` (no NaN), bucket counts added once each.

    It reads the histogram's buckets, which prometheus_client does not publish: where they
    are not found (another version of the library, or a histogram with labels and none
    chosen), each value is observed alone, by the library itself."""
    bounds: list[float] | None = getattr(histogram, "_upper_bounds", None)
    buckets: list[Any] | None = getattr(histogram, "_buckets", None)
    total: Any = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for amount in amounts:
            histogram.observe(amount)
        return
    counts = [0] * len(bounds)
    added = 0.0
    for amount in amounts:
        counts[bisect_left(bounds, amount)] += 1  # the first bound at or above it, as observe picks
        added += amount
    if not any(counts):
        return
    total.inc(added)
    for bucket, count in zip(buckets, counts):
        if count:
            bucket.inc(count)


# --- from workers/batch.py ---
# Which of a batch's rows go on to run, decided against the task store just before the


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
