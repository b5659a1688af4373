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

Nothing here reads a clock or does I/O: the live batcher and the simulator pass
``now`` in, so both run this same code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from brimful.core.policy_params import PolicyParams


class FlushReason(StrEnum):
    """Why a batch left its accumulator (exported as a metric label)."""

    FULL = "full"
    DEADLINE = "deadline"
    REQUEST_DEADLINE = "request_deadline"
    SHUTDOWN = "shutdown"


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
    ) -> FlushPlan:
        """The flush time of a batch of ``pending`` rows whose oldest arrived at ``oldest_arrival``.

        ``earliest_request_deadline`` is the latest moment a row carrying its own
        deadline may leave (its deadline less the expected service time).
        """
        if pending >= self.params.batch_size:
            return FlushPlan(now, FlushReason.FULL)
        waited = max(0.0, now - oldest_arrival)
        at = oldest_arrival + self.wait_budget(pending, rate, waited, patient)
        if earliest_request_deadline is not None and earliest_request_deadline < at:
            return FlushPlan(earliest_request_deadline, FlushReason.REQUEST_DEADLINE)
        return FlushPlan(at, FlushReason.DEADLINE)
