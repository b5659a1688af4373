"""The wait-or-full flush policy: pure decisions on an injected clock.

A partition's batch is flushed when it holds ``batch_size`` rows, or when its
deadline passes. The deadline follows from the measured arrival rate and the empty
slots of the batch (docs/batching.md states it exactly):

- traffic too thin for waiting to pay -> flush after ``min_wait`` (nothing waits for
  a batch that will never fill);
- otherwise -> wait ``fill_slack`` times the expected time to fill the empty slots,
  never past ``max_wait``.

Waiting "pays" when ``max_wait`` is expected to gather ``min_worthwhile_rows`` more rows.
The test has hysteresis: a partition that is waiting keeps waiting until the expected
gain falls below half of that. Without it, a rate estimate that wobbles around the
threshold mixes short and long waits, which costs fill without lowering the p99 wait.

That is the EWMA timer. When the caller also knows the model pool (``PoolCapacity``:
how many calls it can take now, when the next slot frees, the fitted time of a full
call), the plan knows the GPUs too:

- every slot busy -> keep filling: the batch cannot leave before a slot frees, and what
  arrives meanwhile rides along at no latency cost (Triton's batch-grows-while-busy);
- a slot free -> leave at once unless waiting pays: waiting pays when the rows expected
  before the latest moment the oldest row can leave and still meet ``latency_target``
  (less the fitted call time and the measured time a task spends around its batch:
  submit to batcher, call to stored result) number ``min_worthwhile_rows``; then wait until the batch is
  expected full, never past that moment (a control limit on the queue, set by the
  target). ``max_wait`` stays a hard cap on any wait.

A latency target no shorter than ``max_wait`` is the cost mode (``PolicyParams.fill_first``):
a batch leaves full, or at that latest moment; neither a free slot nor a fill estimate sends
it early.

Nothing here reads a clock or does I/O: the live batcher and the simulator pass
``now`` in, so both run this same code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from brimful.core.policy_params import PolicyParams
from brimful.core.pool_capacity import PoolCapacity


class FlushReason(StrEnum):
    """Why a batch left its accumulator (exported as a metric label)."""

    FULL = "full"
    DEADLINE = "deadline"  # the wait the policy planned (fill estimate, max_wait) is over
    SLOT_FREE = "slot_free"  # a model slot is free and waiting is not expected to pay
    TARGET = "target"  # later, the oldest row could not meet the latency target
    REQUEST_DEADLINE = "request_deadline"
    SHUTDOWN = "shutdown"
    BACKFILL = "backfill"  # low-priority rows alone, in a slot no normal row needs (batcher/accumulator.py)


class ArrivalRate:
    """Exponentially weighted arrival rate (requests per second) of one partition.

    Keeps an exponentially decayed count of arrivals, S; with time constant
    tau = halflife / ln 2, S / tau is an unbiased estimate of a steady Poisson rate and
    decays to zero when arrivals stop. But a smoothed rate forgets a burst slowly, and
    a gap much longer than the expected one is evidence on its own that traffic
    dropped: so the reading is capped at ``gap_factor`` divided by the longer of the
    current silence and the gap before the latest arrival. The cap changes only the
    reading, never S, so it costs a steady stream almost no bias.
    """

    gap_factor = 3.0

    def __init__(self, halflife: float) -> None:
        self._tau = halflife / math.log(2)
        self._decayed_count = 0.0
        self._last_update: float | None = None
        self._last_arrival: float | None = None
        self._last_gap = 0.0

    @property
    def halflife(self) -> float:
        return self._tau * math.log(2)

    def set_halflife(self, halflife: float) -> None:
        """Change the smoothing without forgetting the current estimate."""
        rate = self._decayed_count / self._tau
        self._tau = halflife / math.log(2)
        self._decayed_count = rate * self._tau

    def observe(self, now: float, count: int = 1) -> None:
        """Record ``count`` arrivals at ``now``."""
        self._decay_to(now)
        self._decayed_count += count
        if self._last_arrival is not None and now > self._last_arrival:
            self._last_gap = now - self._last_arrival
        self._last_arrival = now

    def rate(self, now: float) -> float:
        """The estimated arrival rate at ``now``."""
        if self._last_update is None or self._last_arrival is None:
            return 0.0
        elapsed = max(0.0, now - self._last_update)
        smoothed = self._decayed_count * math.exp(-elapsed / self._tau) / self._tau
        gap = max(now - self._last_arrival, self._last_gap)
        if gap > 0:
            smoothed = min(smoothed, self.gap_factor / gap)
        return smoothed

    def _decay_to(self, now: float) -> None:
        if self._last_update is not None and now > self._last_update:
            self._decayed_count *= math.exp(-(now - self._last_update) / self._tau)
        if self._last_update is None or now > self._last_update:
            self._last_update = now


@dataclass(frozen=True)
class FlushPlan:
    """When the current batch should leave, and why."""

    at: float
    reason: FlushReason


class WaitOrFullPolicy:
    """Decides when a partially filled batch should be flushed."""

    def __init__(self, params: PolicyParams) -> None:
        self.params = params

    def is_patient(self, rate: float, was_patient: bool) -> bool:
        """Whether waiting pays at this rate; hysteresis keeps a patient partition
        patient until the expected gain halves."""
        if self.params.fill_first:
            return True  # the cost mode: every row may wait its max_wait, whatever the rate
        threshold = self.params.min_worthwhile_rows / 2 if was_patient else self.params.min_worthwhile_rows
        return rate * self.params.max_wait >= threshold

    def wait_budget(self, pending: int, rate: float, waited: float, patient: bool = False) -> float:
        """Total time the oldest pending row may wait, given what is known now.

        ``pending`` rows wait, the oldest for ``waited`` seconds; ``rate`` is the
        estimated arrival rate; ``patient`` is the partition's mode (``is_patient``).
        The result is within [min_wait, max_wait].
        """
        p = self.params
        empty = p.batch_size - pending
        if empty <= 0:
            return 0.0
        if not self.is_patient(rate, patient):
            return p.min_wait
        expected_fill = empty / rate
        return min(p.max_wait, max(p.min_wait, waited + p.fill_slack * expected_fill))

    def plan(
        self,
        now: float,
        pending: int,
        oldest_arrival: float,
        rate: float,
        earliest_request_deadline: float | None = None,
        patient: bool = False,
        capacity: PoolCapacity | None = None,
    ) -> FlushPlan:
        """The flush time of a batch of ``pending`` rows whose oldest arrived at ``oldest_arrival``.

        ``earliest_request_deadline`` is the latest moment a row carrying its own
        deadline may leave (its deadline less the expected service time). With
        ``capacity`` the plan knows the model pool; without it, it is the EWMA timer.
        """
        if pending >= self.params.batch_size:
            return FlushPlan(now, FlushReason.FULL)
        waited = max(0.0, now - oldest_arrival)
        if capacity is None:
            plan = FlushPlan(oldest_arrival + self.wait_budget(pending, rate, waited, patient), FlushReason.DEADLINE)
        else:
            plan = self._plan_for_pool(now, pending, oldest_arrival, rate, capacity)
        if earliest_request_deadline is not None and earliest_request_deadline < plan.at:
            plan = FlushPlan(earliest_request_deadline, FlushReason.REQUEST_DEADLINE)
        if capacity is not None and capacity.free_slots <= 0:
            # Nothing can leave before a slot frees: the batch keeps filling until then.
            plan = FlushPlan(max(plan.at, now + capacity.next_free_in), plan.reason)
        return plan

    def latest_flush(self, oldest_arrival: float, call_time: float) -> tuple[float, FlushReason]:
        """The latest moment the oldest row may leave: in time for the latency target
        after a call of ``call_time``, never before min_wait nor after max_wait."""
        p = self.params
        for_target = max(p.min_wait, p.latency_target - call_time)
        if for_target <= p.max_wait:
            return oldest_arrival + for_target, FlushReason.TARGET
        return oldest_arrival + p.max_wait, FlushReason.DEADLINE

    def _plan_for_pool(
        self, now: float, pending: int, oldest_arrival: float, rate: float, capacity: PoolCapacity
    ) -> FlushPlan:
        p = self.params
        # The target is submit-to-result: what the task spends before and after is not the batch's to wait.
        latest, latest_reason = self.latest_flush(oldest_arrival, capacity.call_time + capacity.around_call)
        earliest = oldest_arrival + p.min_wait
        if now >= latest or p.fill_first:
            # In the cost mode a free slot does not call the batch out, nor does a fill
            # estimate: a rate learnt at a burst's start is low, and one learnt from Kafka's
            # fetched chunks wobbles, and either would send a batch short.
            return FlushPlan(latest, latest_reason)
        # From the moment a slot is free (now, or when one frees), how many more rows
        # would waiting until ``latest`` gather?
        free_from = now if capacity.free_slots > 0 else min(latest, now + capacity.next_free_in)
        expected_gain = rate * (latest - free_from)
        if rate <= 0 or expected_gain < p.min_worthwhile_rows:
            # Work-conserving: no idle slot is kept waiting for rows that will not come.
            return FlushPlan(max(earliest, free_from), FlushReason.SLOT_FREE)
        expected_full = now + p.fill_slack * (p.batch_size - pending) / rate
        if expected_full < latest:
            return FlushPlan(max(earliest, expected_full), FlushReason.DEADLINE)
        return FlushPlan(latest, latest_reason)
