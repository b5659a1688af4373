"""What a batcher's partitions are doing now, for its status (``brimful stats``, the
status board) and its per-partition gauges."""

from __future__ import annotations

from brimful.batcher.partition_state import PartitionState
from brimful.core import metrics
from brimful.core.pool_capacity import PoolCapacity


def partition_status(
    number: int,
    state: PartitionState,
    highwater: int,
    capacity: PoolCapacity,
    now: float,
    wall_now: float,
    export: bool = True,
) -> dict[str, float | int]:
    """One partition's figures; its gauges are set on the way (with ``export``)."""
    accumulator = state.accumulator
    rate = accumulator.effective_rate(now)
    plan = accumulator.plan(now, capacity)
    oldest = accumulator.oldest_arrival
    budget = 0.0 if plan is None or oldest is None else max(0.0, plan.at - oldest)
    lag_s = state.lag_seconds(highwater, now, wall_now)
    if export:
        label = str(number)
        metrics.ARRIVAL_RATE.labels(label).set(rate)
        metrics.FLUSH_DEADLINE.labels(label).set(budget if len(accumulator) else 0.0)
        metrics.PENDING_ROWS.labels(label).set(len(accumulator))
        metrics.CONSUMER_LAG_ROWS.labels(label).set(state.lag_rows(highwater))
        metrics.CONSUMER_LAG_SECONDS.labels(label).set(lag_s)
    return {
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


def pool_status(capacity: PoolCapacity) -> dict[str, float | int]:
    """The model pool as the policy plans with it."""
    return {
        "free_slots": capacity.free_slots,
        "next_free_in_s": round(capacity.next_free_in, 4),
        "call_s": round(capacity.call_time, 4),
        "around_call_s": round(capacity.around_call, 4),
    }
