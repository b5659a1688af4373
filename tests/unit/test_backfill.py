"""Low-priority rows on a virtual clock: taken oldest first into empty slots, a batch of
their own only while no normal row waits or is expected, and promoted once they waited
their bound, so they never starve."""

from __future__ import annotations

from brimful.batcher.accumulator import Accumulator, LowPriorityQueue, backfill_due
from brimful.batcher.policy import WaitOrFullPolicy
from brimful.core.policy_params import PolicyParams


def test_top_ups_take_the_oldest_rows_and_never_more_than_asked() -> None:
    queue: LowPriorityQueue[str] = LowPriorityQueue()
    for index in range(5):
        queue.add(f"low-{index}", now=float(index))
    assert [row.item for row in queue.take(3)] == ["low-0", "low-1", "low-2"]
    assert [row.item for row in queue.take(10)] == ["low-3", "low-4"]
    assert queue.take(1) == [] and len(queue) == 0


def test_rows_past_their_bound_are_promoted_in_order_and_the_rest_wait() -> None:
    queue: LowPriorityQueue[str] = LowPriorityQueue()
    for index, at in enumerate((0.0, 1.0, 2.0, 10.0)):
        queue.add(f"low-{index}", now=at)
    assert queue.next_promotion(low_max_wait=5.0) == 5.0
    assert queue.overdue(now=4.9, low_max_wait=5.0) == []
    assert [row.item for row in queue.overdue(now=7.0, low_max_wait=5.0)] == ["low-0", "low-1", "low-2"]
    assert queue.next_promotion(low_max_wait=5.0) == 15.0 and len(queue) == 1


def test_promoted_rows_join_ahead_of_the_normal_rows_as_the_oldest() -> None:
    params = PolicyParams(batch_size=4, max_wait=1.0, min_wait=0.0)
    accumulator: Accumulator[str] = Accumulator(WaitOrFullPolicy(params))
    accumulator.add("normal", now=9.0)
    queue: LowPriorityQueue[str] = LowPriorityQueue()
    queue.add("low-a", now=1.0)
    queue.add("low-b", now=2.0)
    rate_before = accumulator.effective_rate(9.5)
    accumulator.admit_promoted(queue.overdue(now=9.5, low_max_wait=5.0))
    assert accumulator.oldest_arrival == 1.0  # so max_wait counts from when they came
    assert [row.item for row in accumulator.take()] == ["low-a", "low-b", "normal"]
    assert accumulator.effective_rate(9.5) == rate_before  # promotions are not arrivals


def test_a_batch_of_low_rows_alone_only_when_no_normal_row_waits_or_is_expected() -> None:
    assert backfill_due(normal_pending=0, normal_rate=0.0, latency_target=0.1, low_pending=5)
    assert not backfill_due(normal_pending=1, normal_rate=0.0, latency_target=0.1, low_pending=5)
    # 20 normal rows a second and a 105 ms target: one is expected within it.
    assert not backfill_due(normal_pending=0, normal_rate=20.0, latency_target=0.105, low_pending=5)
    assert backfill_due(normal_pending=0, normal_rate=5.0, latency_target=0.105, low_pending=5)
    assert not backfill_due(normal_pending=0, normal_rate=0.0, latency_target=0.1, low_pending=0)
