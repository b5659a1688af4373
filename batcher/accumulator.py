"""One partition's batch being filled: pending rows, their arrival times, the rate.

No I/O and no clock of its own: the caller passes ``now`` (monotonic seconds), so the
live batcher and the simulator drive the same object.

Low-priority rows (``LowPriorityQueue``) are bulk work that fills the slots a batch would
otherwise pad; pure too, on the same clock. A partition's low-priority rows wait there,
apart from its normal rows, and leave three ways:

- **top-up**: a normal batch that leaves with empty slots takes the oldest low rows into
  them, so a slot that would carry padding carries work;
- **backfill**: while the partition has no normal row waiting and expects none within the
  latency target (its normal arrival rate times the target is under one row), a free
  model slot takes a batch of low rows alone;
- **promotion**: a low row that waited ``low_max_wait`` joins the normal rows, in order,
  and competes as one of them. That is the bound on how long low-priority work can starve:
  under a normal load that fills every batch, it waits ``low_max_wait`` and then queues
  as normal work does."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from brimful.batcher.policy import ArrivalRate, FlushPlan, FlushReason, WaitOrFullPolicy
from brimful.core.policy_params import PolicyParams
from brimful.core.pool_capacity import PoolCapacity

T = TypeVar("T")


@dataclass(slots=True)
class Pending(Generic[T]):
    """A row waiting for its batch. Not changed once made (not frozen: one is made a row,
    and a frozen dataclass's fields are set through ``object.__setattr__``, 4x the cost)."""

    item: T
    arrived_at: float
    flush_by: float | None = None  # latest moment it may leave to meet its own deadline
    stamp: float | None = None  # when it was submitted (seconds, the producer's clock), if known


def split_matching(rows: deque[Pending[T]], matches: Callable[[T], bool]) -> tuple[deque[Pending[T]], list[Pending[T]]]:
    """(the rows whose item does not match, those whose item does), each in order."""
    kept: deque[Pending[T]] = deque()
    removed: list[Pending[T]] = []
    for row in rows:
        (removed if matches(row.item) else kept).append(row)
    return kept, removed


class Accumulator(Generic[T]):
    """Wait-or-full accumulator of one partition."""

    def __init__(self, policy: WaitOrFullPolicy) -> None:
        self.policy = policy
        self.rate = ArrivalRate(policy.params.rate_halflife)
        self.patient = False  # the policy's waiting mode, updated as rows arrive
        self._pending: deque[Pending[T]] = deque()

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def oldest_arrival(self) -> float | None:
        """When the longest-waiting row arrived; None when nothing waits."""
        return self._pending[0].arrived_at if self._pending else None

    def set_params(self, params: PolicyParams) -> None:
        """Adopt new parameters; rows already waiting are judged by them from now on."""
        self.policy = WaitOrFullPolicy(params)
        if params.rate_halflife != self.rate.halflife:
            self.rate.set_halflife(params.rate_halflife)

    def add(self, item: T, now: float, flush_by: float | None = None, stamp: float | None = None) -> None:
        """A row arrived. ``stamp`` is when it was submitted: rows read from Kafka arrive
        here in chunks, so their submission times are the truer spacing."""
        self.add_many([Pending(item, now, flush_by, stamp)], now)

    def add_many(self, rows: list[Pending[T]], now: float) -> None:
        """Rows that arrived together at ``now`` (one fetch's, in order): counted as that
        many arrivals, and the policy's mode judged once, on all of them."""
        if not rows:
            return
        self.rate.observe(now, len(rows))
        self._pending.extend(rows)
        self.patient = self.policy.is_patient(self.effective_rate(now), self.patient)

    def admit_promoted(self, rows: list[Pending[T]]) -> None:
        """Rows that waited elsewhere (low-priority rows past their bound) join ahead of
        the rows waiting here, as the oldest they are; they are not arrivals, so the
        rate does not count them."""
        self._pending.extendleft(reversed(rows))

    def effective_rate(self, now: float) -> float:
        """The rate the policy plans with: the smoothed estimate, or the current batch's
        own arrival rate once it holds a few rows, whichever is higher. The smoothed rate
        learns a burst slowly; the rows of the burst already waiting are direct evidence.
        Both are capped by the silence since the last arrival."""
        smoothed = self.rate.rate(now)
        rows = len(self._pending)
        if rows < max(2.0, self.policy.params.min_worthwhile_rows):
            return smoothed
        oldest, newest = self._pending[0], self._pending[-1]
        if oldest.stamp is not None and newest.stamp is not None:
            span = newest.stamp - oldest.stamp
        else:
            span = newest.arrived_at - oldest.arrived_at
        if span <= 0:
            return smoothed
        in_batch = (rows - 1) / span
        silence = now - newest.arrived_at
        if silence > 0:
            in_batch = min(in_batch, ArrivalRate.gap_factor / silence)
        return max(smoothed, in_batch)

    def plan(self, now: float, capacity: PoolCapacity | None = None) -> FlushPlan | None:
        """When the current batch should leave; None when nothing waits. ``capacity``:
        what the model pool can take (see ``WaitOrFullPolicy.plan``)."""
        if not self._pending:
            return None
        deadlines = [p.flush_by for p in self._pending if p.flush_by is not None]
        return self.policy.plan(
            now=now,
            pending=len(self._pending),
            oldest_arrival=self._pending[0].arrived_at,
            rate=self.effective_rate(now),
            earliest_request_deadline=min(deadlines) if deadlines else None,
            patient=self.patient,
            capacity=capacity,
        )

    def due(self, now: float, capacity: PoolCapacity | None = None) -> FlushReason | None:
        """The reason to flush now, or None if the batch should keep filling."""
        plan = self.plan(now, capacity)
        if plan is None or plan.at > now:
            return None
        return plan.reason

    def take(self) -> list[Pending[T]]:
        """Remove and return the next batch: the oldest rows, at most batch_size."""
        count = min(len(self._pending), self.policy.params.batch_size)
        return [self._pending.popleft() for _ in range(count)]

    def remove(self, matches: Callable[[T], bool]) -> list[Pending[T]]:
        """Take out the waiting rows whose item ``matches`` (a cancelled task), keeping order."""
        self._pending, removed = split_matching(self._pending, matches)
        return removed

    def drain(self) -> list[Pending[T]]:
        """Remove and return everything waiting (partition revoked or shutting down)."""
        rows = list(self._pending)
        self._pending.clear()
        return rows


class LowPriorityQueue(Generic[T]):
    """One partition's low-priority rows, oldest first."""

    def __init__(self) -> None:
        self._rows: deque[Pending[T]] = deque()

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, item: T, now: float, stamp: float | None = None) -> None:
        self._rows.append(Pending(item, now, None, stamp))

    def take(self, count: int) -> list[Pending[T]]:
        """The oldest ``count`` rows at most (a top-up, or a backfill batch)."""
        return [self._rows.popleft() for _ in range(min(count, len(self._rows)))]

    def overdue(self, now: float, low_max_wait: float) -> list[Pending[T]]:
        """Remove and return the rows that waited ``low_max_wait`` or longer: promoted."""
        promoted = []
        while self._rows and now - self._rows[0].arrived_at >= low_max_wait:
            promoted.append(self._rows.popleft())
        return promoted

    def next_promotion(self, low_max_wait: float) -> float | None:
        """When the oldest row is promoted; None when nothing waits."""
        return self._rows[0].arrived_at + low_max_wait if self._rows else None

    def remove(self, matches: Callable[[T], bool]) -> list[Pending[T]]:
        """Take out the rows whose item ``matches`` (a cancelled task), keeping order."""
        self._rows, removed = split_matching(self._rows, matches)
        return removed

    def drain(self) -> list[Pending[T]]:
        rows = list(self._rows)
        self._rows.clear()
        return rows


def backfill_due(normal_pending: int, normal_rate: float, latency_target: float, low_pending: int) -> bool:
    """Whether a free slot should take a batch of low-priority rows alone: some wait, no
    normal row waits, and none is expected within the latency target (a normal row that
    came now would find the slot taken for up to one call)."""
    return low_pending > 0 and normal_pending == 0 and normal_rate * latency_target < 1.0
