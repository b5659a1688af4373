"""A task that cannot be computed fails with its dead letter: the letter is written before
the task reads ``failed``, so a crash in between repeats the batch and never loses the
request. Each failed call is remembered per task, for the letter.

``Isolation`` decides how to find the rows that make the model refuse a batch, so the rest
complete; the batch runner calls the model as it says. A
refused batch of several tenants is split by tenant first, and each tenant's rows are
isolated on that tenant's own ``IsolationBudget``: one tenant's failing rows never cost
another tenant calls or hold its rows back. A single tenant's refused group is split in
halves (each padded back to the full size by the call) until the failing rows are alone; a
row that still fails alone is retried up to ``max_attempts`` calls in all, then fails with
its dead letter. Once a tenant's budget is spent, its refused rows fail at once."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from brimful.core.clock import now_ms
from brimful.core.model_catalogue import ModelSignature, row_mismatch
from brimful.core.stats import SharedStats, StatsField
from brimful.core.task_store import TaskStore
from brimful.schemas import Attempt
from brimful.workers.batch import Batch, BatchItem, BatchOutcome, known_tasks
from brimful.workers.dead_letters import DeadLetterWriter, dead_letter
from brimful.workers.isolation_budget import IsolationBudget
from brimful.workers.model_errors import ErrorClass, ModelCallError
from brimful.workers.retry_policy import BatchRetryPolicy
from brimful.workers.shared_rows import SharedRows

log = logging.getLogger("brimful.worker")


@dataclass
class Attempts:
    """Failed calls per task, for the dead letters."""

    by_task: dict[str, list[Attempt]] = field(default_factory=dict)

    def record(self, items: Iterable[BatchItem], error: ModelCallError) -> None:
        attempt = Attempt(at_ms=now_ms(), error_class=error.error_class.value, error_message=error.message)
        for item in items:
            self.by_task.setdefault(item.task_id, []).append(attempt)

    def of(self, item: BatchItem) -> list[Attempt]:
        return self.by_task.get(item.task_id, [])


class TaskFailures:
    """Fails tasks, each with its dead letter."""

    def __init__(
        self,
        signature: ModelSignature,
        store: TaskStore,
        stats: SharedStats,
        dead_letters: DeadLetterWriter,
        shared: SharedRows,
    ) -> None:
        self.signature = signature
        self.store = store
        self.stats = stats
        self.dead_letters = dead_letters
        self.shared = shared

    async def fail(
        self, batch: Batch, items: list[BatchItem], error: ModelCallError, attempts: Attempts, outcome: BatchOutcome
    ) -> None:
        """Fail ``items`` with ``error``; their identical tasks in the batch fail as they
        did, with the same attempts (the same inputs to the same model)."""
        twins = self.shared.failed(outcome, items)
        for item, twin in twins:
            attempts.by_task[twin.task_id] = attempts.of(item)
        items = items + [twin for _, twin in twins]
        failed_at = now_ms()
        letters = [
            dead_letter(
                item.request,
                error.error_class.value,
                error.message,
                item.partition,
                item.offset,
                failed_at,
                attempts=attempts.of(item),
                batch_id=batch.batch_id,
                batch_task_ids=[i.task_id for i in batch.items],
                signature=self.signature,
            )
            for item in items
        ]
        await self.dead_letters.write(letters)
        # One store call per attempt count (the only part of the error that differs by
        # task), so a whole failed batch is usually one round trip.
        by_attempts: dict[int, list[str]] = {}
        for item in items:
            by_attempts.setdefault(len(attempts.of(item)), []).append(item.task_id)
        for count, task_ids in by_attempts.items():
            outcome.failed += await self.store.mark_failed(
                task_ids,
                {
                    "class": error.error_class.value,
                    "message": error.message,
                    "attempts": count,
                    "batch_id": batch.batch_id,
                },
                known=known_tasks(items, self.signature.name),
            )
        await self.stats.add({StatsField.TASKS_FAILED: len(items)})
        for item in items:
            log.error(
                "task failed to the DLQ",
                extra={"task_id": item.task_id, "batch_id": batch.batch_id, "error_class": error.error_class.value},
            )

    async def fail_unfit(self, batch: Batch, items: list[BatchItem], outcome: BatchOutcome) -> list[BatchItem]:
        """Fail at once, each with its dead letter, the tasks whose inputs do not fit the
        signature the model is called with (checked against another version of it: a
        replayed dead letter, a model changed under a backlog), before any is stacked into
        a tensor: one unfit row must not fail its neighbours. Returns the rest."""
        fit: list[BatchItem] = []
        unfit: dict[str, list[BatchItem]] = {}  # by reason
        for item in items:
            inputs = item.request.inputs
            reason = None
            for spec in self.signature.inputs:
                reason = row_mismatch(spec, inputs.get(spec.name, None))
                if reason is not None:
                    break
            if reason is None:
                fit.append(item)
            else:
                unfit.setdefault(reason, []).append(item)
        for reason, group in unfit.items():
            error = ModelCallError(ErrorClass.REJECTED, f"{reason} ({self.signature.name} {self.signature.version})")
            await self.fail(batch, group, error, Attempts(), outcome)
        return fit


@dataclass(frozen=True)
class Refusal:
    """What follows a call the model refused: resolve each of ``groups`` apart (the rows
    split by tenant, or in halves); with no groups, call again after ``retry_in_s``, or,
    where that is None, fail the rows."""

    groups: list[list[BatchItem]]
    retry_in_s: float | None = None


class Isolation:
    """Decides how the rows of a refused call are isolated (see the module's docstring):
    pure, on an injected clock. The batch runner calls, stores and fails as it says."""

    def __init__(self, retry: BatchRetryPolicy, budget: IsolationBudget, clock: Callable[[], float]) -> None:
        self.retry = retry
        self.budget = budget
        self._clock = clock

    def over_budget(self, items: list[BatchItem]) -> ModelCallError | None:
        """Take one call of the budget of the tenant of ``items`` (a single-tenant group
        being isolated); the error its rows fail with if that tenant has none left."""
        tenant = items[0].request.tenant
        if self.budget.take(tenant, self._clock()):
            return None
        return ModelCallError(
            ErrorClass.MODEL_ERROR,
            f"the model refused a batch holding this row, and tenant {tenant!r} has spent its budget of "
            "calls to find which of its rows fail; retry later or replay from the DLQ",
        )

    def after_refusal(self, items: list[BatchItem], refusals: int) -> Refusal:
        """After the ``refusals``-th refused call of ``items``: split several tenants'
        rows by tenant, a tenant's several rows in halves; a row alone is called again
        while the retry policy allows."""
        tenants = sorted({item.request.tenant for item in items})
        if len(tenants) > 1:
            return Refusal([[item for item in items if item.request.tenant == tenant] for tenant in tenants])
        if len(items) > 1:
            middle = len(items) // 2
            return Refusal([items[:middle], items[middle:]])
        return Refusal([], self.retry.delay_before(refusals + 1))
