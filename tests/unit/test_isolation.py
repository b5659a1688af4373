"""Finding the failing rows of a refused batch: the decisions of ``Isolation``
(workers/task_failures.py, pure) and the batch runner carrying them out, over a fake model
that refuses any call holding a ``!fail`` row, with a store and DLQ that record."""

from __future__ import annotations

from brimful.workers.batch import Batch, BatchItem
from brimful.workers.isolation_budget import IsolationBudget
from brimful.workers.retry_policy import BatchRetryPolicy
from brimful.workers.task_failures import Isolation
from tests.helpers.fake_store import fake_runner, text_item


def item(text: str, tenant: str = "acme") -> BatchItem:
    return text_item(f"{tenant}-{text}", text, tenant)


def isolation(budget: IsolationBudget | None = None, max_attempts: int = 3) -> Isolation:
    return Isolation(
        BatchRetryPolicy(max_attempts=max_attempts, base_delay=0.0), budget or IsolationBudget(), lambda: 0.0
    )


def test_a_refusal_splits_tenants_apart_then_a_tenants_rows_in_halves_then_retries_a_row_alone() -> None:
    decide = isolation(max_attempts=3)
    mixed = [item("a1"), item("g1", "globex"), item("a2")]
    assert decide.after_refusal(mixed, 1).groups == [[mixed[0], mixed[2]], [mixed[1]]]
    four = [item(f"r{n}") for n in range(4)]
    assert decide.after_refusal(four, 1).groups == [four[:2], four[2:]]
    alone = [item("r")]
    assert [decide.after_refusal(alone, n).retry_in_s is not None for n in (1, 2, 3)] == [True, True, False]
    assert decide.after_refusal(alone, 1).groups == []


def test_a_tenant_past_its_budget_is_refused_by_name_and_another_tenant_is_not() -> None:
    decide = isolation(IsolationBudget(calls_per_s=0.0, burst=1))
    assert decide.over_budget([item("a")]) is None
    spent = decide.over_budget([item("b")])
    assert spent is not None and "'acme'" in spent.message and "budget" in spent.message
    assert decide.over_budget([item("g", "globex")]) is None


async def test_a_batch_the_model_takes_is_one_call_stored_whole() -> None:
    runner, model, store, _ = fake_runner(BatchRetryPolicy(max_attempts=3, base_delay=0.0))
    rows = [item(f"ok {n}") for n in range(8)]
    await runner.run(Batch("b1", 0, rows, "full"))
    assert len(model.calls) == 1 and len(model.calls[0]) == 8
    assert sorted(store.done) == sorted(row.task_id for row in rows) and store.failed == {}


async def test_one_failing_row_fails_alone_after_its_attempts_and_its_neighbours_complete() -> None:
    runner, model, store, letters = fake_runner(BatchRetryPolicy(max_attempts=3, base_delay=0.0))
    rows = [item(f"ok {n}") for n in range(8)]
    rows[5] = item("!fail 5")
    await runner.run(Batch("b1", 0, rows, "full"))
    assert sorted(store.done) == sorted(row.task_id for row in rows if row is not rows[5])
    assert list(store.failed) == [rows[5].task_id]
    assert model.calls.count([b"!fail 5"]) == 3  # retried alone up to max_attempts calls, then given up
    [letter] = letters.written
    assert len(letter.attempts) == 3 + 3  # the halvings that held it, then its own calls
    assert all(b"!fail 5" not in call or len(call) < 8 for call in model.calls[1:])


async def test_a_refused_batch_of_two_tenants_is_isolated_per_tenant_on_its_own_budget() -> None:
    budget = IsolationBudget(calls_per_s=0.0, burst=2)  # two isolation calls per tenant
    runner, model, store, _ = fake_runner(BatchRetryPolicy(max_attempts=3, base_delay=0.0), isolation=budget)
    acme = [item("!fail a", "acme"), item("ok a", "acme")]
    globex = [item(f"ok g{n}", "globex") for n in range(4)]
    await runner.run(Batch("b1", 0, [acme[0], globex[0], acme[1], *globex[1:]], "full"))
    # globex's rows are one call of their own, after the split by tenant; none of them failed.
    assert [b"ok g0", b"ok g1", b"ok g2", b"ok g3"] in model.calls
    assert set(store.done) >= {row.task_id for row in globex}
    # acme's failing row spent acme's calls; what it still had refused then fails at once,
    # naming the budget, and never a row of globex's.
    assert set(store.failed) <= {row.task_id for row in acme}
    assert acme[0].task_id in store.failed
    assert all("budget" in error["message"] for error in store.failed.values())
    assert not budget.take("acme", 0.0)
    # globex's group cost globex one call of its own budget, whatever acme's rows cost.
    assert budget.take("globex", 0.0) and not budget.take("globex", 0.0)
