"""Finding the failing rows of a refused batch (workers/task_failures.py), on fakes: a model
that refuses any call holding a ``!fail`` row, and a store and DLQ that record."""

from __future__ import annotations

from typing import Any

import numpy as np

from brimful.schemas import InputTensor, TaskRequest
from brimful.workers.batch import Batch, BatchItem, BatchOutcome, Seat
from brimful.workers.isolation_budget import IsolationBudget
from brimful.workers.model_errors import ErrorClass, ModelCallError
from brimful.workers.retry_policy import BatchRetryPolicy
from brimful.workers.task_failures import Attempts, Isolation, Outputs


def item(text: str, tenant: str = "acme", offset: int = 0) -> BatchItem:
    request = TaskRequest(task_id=f"{tenant}-{text}", model="m", tenant=tenant)
    request.inputs["TEXT"].CopyFrom(InputTensor(datatype="BYTES", shape=[1], bytes_contents=[text.encode()]))
    return BatchItem(request, partition=0, offset=offset)


def text(row: BatchItem) -> str:
    return row.request.inputs["TEXT"].bytes_contents[0].decode()


class FakeModel:
    """Refuses a call holding a ``!fail`` row; records every call's rows."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.stored: list[str] = []
        self.failed: list[tuple[str, str]] = []  # (task id, message)

    async def call(
        self,
        batch: Batch,
        seat: Seat,
        rows: list[BatchItem],
        attempts: Attempts,
        outcome: BatchOutcome,
        isolating: bool,
    ) -> Outputs:
        self.calls.append([row.task_id for row in rows])
        outcome.calls += 1
        if any(text(row).startswith("!fail") for row in rows):
            error = ModelCallError(ErrorClass.MODEL_ERROR, "refused")
            attempts.record(rows, error)
            raise error
        return {"N": np.arange(len(rows))}

    async def store(
        self, batch: Batch, rows: list[BatchItem], outputs: Outputs, attempts: Attempts, outcome: BatchOutcome
    ) -> None:
        assert len(outputs["N"]) == len(rows)
        self.stored += [row.task_id for row in rows]

    async def fail(
        self, batch: Batch, rows: list[BatchItem], error: ModelCallError, attempts: Attempts, outcome: BatchOutcome
    ) -> None:
        self.failed += [(row.task_id, error.message) for row in rows]


async def no_sleep(_: float) -> None:
    pass


def isolation(model: FakeModel, budget: IsolationBudget | None = None, max_attempts: int = 3) -> Isolation:
    return Isolation(
        model.call,
        model.store,
        model.fail,
        BatchRetryPolicy(max_attempts=max_attempts, base_delay=0.0),
        budget or IsolationBudget(),
        clock=lambda: 0.0,
        sleep=no_sleep,
    )


async def resolve(model: FakeModel, rows: list[BatchItem], **options: Any) -> Attempts:
    attempts = Attempts()
    batch = Batch("b1", 0, rows, "full")
    await isolation(model, **options).resolve(batch, Seat(None), rows, attempts, BatchOutcome())
    return attempts


async def test_a_batch_the_model_takes_is_one_call_stored_whole() -> None:
    model = FakeModel()
    rows = [item(f"ok {n}") for n in range(8)]
    await resolve(model, rows)
    assert model.calls == [[row.task_id for row in rows]]
    assert model.stored == [row.task_id for row in rows] and model.failed == []


async def test_one_failing_row_fails_alone_after_its_attempts_and_its_neighbours_complete() -> None:
    model = FakeModel()
    rows = [item(f"ok {n}") for n in range(8)]
    rows[5] = item("!fail 5")
    attempts = await resolve(model, rows, max_attempts=3)
    assert sorted(model.stored) == sorted(row.task_id for row in rows if row is not rows[5])
    assert [task_id for task_id, _ in model.failed] == [rows[5].task_id]
    alone = [call for call in model.calls if call == [rows[5].task_id]]
    assert len(alone) == 3  # retried alone up to max_attempts calls, then given up
    assert len(attempts.of(rows[5])) == 3 + 3  # the halvings that held it, then its own calls
    assert all(rows[5].task_id not in call or len(call) < 8 for call in model.calls[1:])


async def test_a_refused_batch_of_two_tenants_is_isolated_per_tenant_on_its_own_budget() -> None:
    model = FakeModel()
    acme = [item("!fail a", "acme"), item("ok a", "acme")]
    globex = [item(f"ok g{n}", "globex") for n in range(4)]
    budget = IsolationBudget(calls_per_s=0.0, burst=2)  # two isolation calls per tenant
    await resolve(model, [acme[0], globex[0], acme[1], *globex[1:]], budget=budget)
    # globex's rows are one call of their own, after the split by tenant; none of them failed.
    assert [row.task_id for row in globex] in model.calls
    assert set(model.stored) >= {row.task_id for row in globex}
    # acme's failing row spent acme's calls; what it still had refused then fails at once,
    # naming the budget, and never a row of globex's.
    assert {task_id for task_id, _ in model.failed} <= {row.task_id for row in acme}
    assert acme[0].task_id in dict(model.failed)
    assert all("budget" in message for _, message in model.failed)
    assert not budget.take("acme", 0.0)
    # globex's group cost globex one call of its own budget, whatever acme's rows cost.
    assert budget.take("globex", 0.0) and not budget.take("globex", 0.0)
