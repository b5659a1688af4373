"""What the batcher hands the GPU side, and what running it did: the batch types. The
batcher imports these, not the runner."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from brimful.core import metrics
from brimful.core.clock import now_ms
from brimful.core.histogram_batches import observe_all
from brimful.schemas import TaskRequest
from brimful.workers.slot import Slot

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


def observe_latency(items: list[BatchItem]) -> None:
    """Each task's time from submission to its stored result."""
    finished_ms = now_ms()
    observe_all(metrics.TASK_LATENCY, [max(0, finished_ms - item.request.submitted_at_ms) / 1000 for item in items])
