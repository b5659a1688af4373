"""Each tenant's budget of calls for isolating failing rows: pure, on a virtual clock."""

from __future__ import annotations

from brimful.workers.isolation_budget import IsolationBudget


def test_a_tenant_spends_its_burst_then_refills_at_the_rate() -> None:
    budget = IsolationBudget(calls_per_s=2.0, burst=5)
    assert [budget.take("mallory", now=0.0) for _ in range(6)] == [True] * 5 + [False]
    assert not budget.take("mallory", now=0.4)  # 0.8 of a call refilled: not yet
    assert budget.take("mallory", now=0.5)  # one call back
    assert not budget.take("mallory", now=0.5)
    assert [budget.take("mallory", now=100.0) for _ in range(6)] == [True] * 5 + [False]  # never above the burst


def test_tenants_have_budgets_of_their_own() -> None:
    budget = IsolationBudget(calls_per_s=0.001, burst=3)
    for _ in range(3):
        assert budget.take("mallory", now=0.0)
    assert not budget.take("mallory", now=0.0)
    assert all(budget.take("alice", now=0.0) for _ in range(3))


def test_a_burst_of_zero_means_no_bound() -> None:
    budget = IsolationBudget(calls_per_s=1.0, burst=0)
    assert all(budget.take("anyone", now=0.0) for _ in range(10_000))


def test_memory_is_bounded_by_forgetting_the_fullest_buckets() -> None:
    budget = IsolationBudget(calls_per_s=1.0, burst=10, max_tenants=100)
    for _ in range(10):
        budget.take("mallory", now=0.0)  # spent: must be kept
    for index in range(1_000):
        budget.take(f"tenant-{index}", now=0.0)
    assert len(budget._buckets) <= 100
    assert not budget.take("mallory", now=0.0)  # a spent bucket is not forgotten
