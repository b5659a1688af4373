"""Replay an arrival trace through the live policy code on a virtual clock.

Each partition is driven exactly as the live batcher drives it: rows are added to an
``Accumulator`` as they arrive, and at every moment the accumulator is asked whether its
batch is due; a due batch leaves when a model slot is free (``max_in_flight`` per
partition, each call taking ``service_time`` seconds). No real time passes, so an hour
of traffic replays in seconds, and a sweep compares settings on the same arrivals.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from brimful.batcher.accumulator import Accumulator
from brimful.batcher.policy import FlushReason, WaitOrFullPolicy
from brimful.batcher.traces import Trace
from brimful.core.policy_params import PolicyParams


@dataclass(frozen=True)
class SimulationResult:
    """What a replay produced, over every partition."""

    rows: int
    batches: int
    batch_size: int
    duration_s: float
    waits_s: tuple[float, ...]  # queue wait of every row, sorted
    flushes: dict[str, int]

    @property
    def mean_rows_per_batch(self) -> float:
        return self.rows / self.batches if self.batches else 0.0

    @property
    def padded_share(self) -> float:
        """Share of all slots sent to the model that were padding."""
        slots = self.batches * self.batch_size
        return (slots - self.rows) / slots if slots else 0.0

    def wait_quantile(self, q: float) -> float:
        if not self.waits_s:
            return 0.0
        index = min(len(self.waits_s) - 1, max(0, math.ceil(q * len(self.waits_s)) - 1))
        return self.waits_s[index]

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.duration_s if self.duration_s > 0 else 0.0

    def summary(self) -> dict[str, float]:
        return {
            "rows": self.rows,
            "batches": self.batches,
            "mean_rows_per_batch": round(self.mean_rows_per_batch, 2),
            "padded_share": round(self.padded_share, 4),
            "p50_wait_ms": round(self.wait_quantile(0.50) * 1000, 2),
            "p99_wait_ms": round(self.wait_quantile(0.99) * 1000, 2),
            "batches_per_s": round(self.batches_per_s, 2),
        }


def _replay_partition(
    arrivals: list[float], params: PolicyParams, service_time: float, max_in_flight: int,
    waits: list[float], flushes: dict[str, int],
) -> int:
    accumulator: Accumulator[float] = Accumulator(WaitOrFullPolicy(params))
    busy_until: list[float] = []  # completion times of calls in flight (a heap)
    batches = 0
    index = 0
    now = arrivals[0] if arrivals else 0.0
    while index < len(arrivals) or len(accumulator):
        while busy_until and busy_until[0] <= now:
            heapq.heappop(busy_until)
        while len(accumulator) and len(busy_until) < max_in_flight:
            reason = accumulator.due(now)
            if reason is None:
                break
            rows = accumulator.take()
            waits.extend(now - row.arrived_at for row in rows)
            flushes[reason.value] = flushes.get(reason.value, 0) + 1
            heapq.heappush(busy_until, now + service_time)
            batches += 1
        # The next moment anything can change: an arrival, the batch's own flush time
        # (when a slot is free), or a slot freeing up.
        next_arrival = arrivals[index] if index < len(arrivals) else math.inf
        plan = accumulator.plan(now)
        if plan is None:
            next_flush = math.inf
        elif len(busy_until) < max_in_flight:
            next_flush = max(plan.at, now)
        else:
            next_flush = busy_until[0]
        upcoming = min(next_arrival, next_flush)
        if upcoming == math.inf:
            break
        # Always forward: a free slot with a batch due now was used above.
        now = max(now, upcoming)
        while index < len(arrivals) and arrivals[index] <= now:
            accumulator.add(arrivals[index], arrivals[index])
            index += 1
    return batches


def simulate(
    trace: Trace, params: PolicyParams, service_time: float = 0.005, max_in_flight: int = 2
) -> SimulationResult:
    """Replay every partition of ``trace`` through the policy with ``params``."""
    waits: list[float] = []
    flushes: dict[str, int] = {reason.value: 0 for reason in FlushReason}
    batches = 0
    rows = 0
    starts, ends = [], []
    for arrivals in trace.values():
        if not arrivals:
            continue
        batches += _replay_partition(arrivals, params, service_time, max_in_flight, waits, flushes)
        rows += len(arrivals)
        starts.append(arrivals[0])
        ends.append(arrivals[-1])
    duration = (max(ends) - min(starts)) if starts else 0.0
    return SimulationResult(
        rows=rows,
        batches=batches,
        batch_size=params.batch_size,
        duration_s=duration,
        waits_s=tuple(sorted(waits)),
        flushes=flushes,
    )
