"""Replay an arrival trace through the live policy code, against a model of the pool, on
a virtual clock.

Every partition is driven exactly as the live batcher drives it: rows are added to an
``Accumulator`` as they arrive, and at every moment each accumulator is asked whether its
batch is due; a due batch leaves when a slot of the pool is free (``PoolModel``: N
endpoints with their slots, each call taking ``call_s + per_row_s * rows``, give or take
``jitter``). With ``aware`` the policy is told what the pool can take (free slots, when
the next frees, the time of a full call, the time a task spends around its batch), as the
live batcher tells it; without, it is the EWMA timer alone. No real time passes, so an
hour of traffic replays in seconds, and settings are compared on the same arrivals.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass

from brimful.batcher.accumulator import Accumulator
from brimful.batcher.policy import FlushReason, WaitOrFullPolicy
from brimful.batcher.traces import Trace
from brimful.core.policy_params import PolicyParams
from brimful.core.pool_capacity import PoolCapacity


@dataclass(frozen=True)
class PoolModel:
    """The model endpoints a replay sends its batches to."""

    endpoints: int = 1
    slots_per_endpoint: int = 2
    call_s: float = 0.005  # time of a call whatever its rows (b)
    per_row_s: float = 0.0  # and for each real row (a)
    jitter: float = 0.0  # each call takes its time x uniform(1 - jitter, 1 + jitter)
    seed: int = 0
    # What a task spends outside its batch and its call: submit to batcher, call end to
    # stored result. Live, it counts against the latency target; the batcher's /status
    # shows its measure (``pool.around_call_s``).
    around_s: float = 0.0

    @property
    def slots(self) -> int:
        return self.endpoints * self.slots_per_endpoint

    def expected_call_s(self, rows: int) -> float:
        return self.call_s + self.per_row_s * rows

    def call_time(self, rows: int, rng: random.Random) -> float:
        spread = rng.uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else 1.0
        return self.expected_call_s(rows) * spread


def _quantile(values: tuple[float, ...], q: float) -> float:
    if not values:
        return 0.0
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


@dataclass(frozen=True)
class SimulationResult:
    """What a replay produced, over every partition."""

    rows: int
    batches: int
    batch_size: int
    duration_s: float
    waits_s: tuple[float, ...]  # queue wait of every row, sorted
    latencies_s: tuple[float, ...]  # submit to result (around + wait + call) of every row, sorted
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
        return _quantile(self.waits_s, q)

    def latency_quantile(self, q: float) -> float:
        return _quantile(self.latencies_s, q)

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
            "p50_ms": round(self.latency_quantile(0.50) * 1000, 2),
            "p99_ms": round(self.latency_quantile(0.99) * 1000, 2),
            "batches_per_s": round(self.batches_per_s, 2),
        }


def simulate(trace: Trace, params: PolicyParams, pool: PoolModel = PoolModel(), aware: bool = True) -> SimulationResult:
    """Replay every partition of ``trace`` through the policy with ``params``, all of them
    sharing ``pool``; ``aware``: the policy plans with the pool's capacity."""
    rng = random.Random(pool.seed)
    accumulators = {p: Accumulator[float](WaitOrFullPolicy(params)) for p in trace}
    arrivals = sorted((t, p) for p, times in trace.items() for t in times)
    busy_until: list[float] = []  # completion times of the calls in flight (a heap)
    waits: list[float] = []
    latencies: list[float] = []
    flushes = {reason.value: 0 for reason in FlushReason}
    full_call = pool.expected_call_s(params.batch_size)
    batches = 0
    index = 0
    now = arrivals[0][0] if arrivals else 0.0

    def capacity() -> PoolCapacity | None:
        if not aware:
            return None
        free = pool.slots - len(busy_until)
        next_free = 0.0 if free > 0 else max(0.0, busy_until[0] - now)
        return PoolCapacity(free, next_free, full_call, around_call=pool.around_s)

    while index < len(arrivals) or any(len(a) for a in accumulators.values()):
        while busy_until and busy_until[0] <= now:
            heapq.heappop(busy_until)
        waiting = [a for a in accumulators.values() if len(a)]
        # Oldest waiting rows first, as the live batcher orders them.
        for accumulator in sorted(waiting, key=lambda a: a.oldest_arrival or 0.0):
            while len(accumulator) and len(busy_until) < pool.slots:
                reason = accumulator.due(now, capacity())
                if reason is None:
                    break
                rows = accumulator.take()
                call = pool.call_time(len(rows), rng)
                waits.extend(now - row.arrived_at for row in rows)
                latencies.extend(now + call + pool.around_s - row.arrived_at for row in rows)
                flushes[reason.value] += 1
                heapq.heappush(busy_until, now + call)
                batches += 1
        # The next moment anything can change: an arrival, a batch's own flush time (when
        # a slot is free), or a slot freeing up.
        upcoming = arrivals[index][0] if index < len(arrivals) else math.inf
        if len(busy_until) < pool.slots:
            view = capacity()
            for accumulator in accumulators.values():
                plan = accumulator.plan(now, view)
                if plan is not None:
                    upcoming = min(upcoming, max(plan.at, now))
        if busy_until:
            upcoming = min(upcoming, busy_until[0])
        if upcoming == math.inf:
            break
        # Always forward: whatever was due now was dispatched above, unless no slot was free.
        if upcoming <= now and len(busy_until) < pool.slots:
            upcoming = math.nextafter(now, math.inf)
        now = max(now, upcoming)
        while index < len(arrivals) and arrivals[index][0] <= now:
            at, partition = arrivals[index]
            accumulators[partition].add(at, at)
            index += 1
    starts = [times[0] for times in trace.values() if times]
    ends = [times[-1] for times in trace.values() if times]
    return SimulationResult(
        rows=len(arrivals),
        batches=batches,
        batch_size=params.batch_size,
        duration_s=(max(ends) - min(starts)) if starts else 0.0,
        waits_s=tuple(sorted(waits)),
        latencies_s=tuple(sorted(latencies)),
        flushes=flushes,
    )
