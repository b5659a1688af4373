"""A task that cannot be computed fails with its dead letter: the letter is written before
the task reads ``failed``, so a crash in between repeats the batch and never loses the
request. Each failed call is remembered per task, for the letter.

``Isolation`` finds the rows that make the model refuse a batch, so the rest complete. A
refused batch of several tenants is split by tenant first, and each tenant's rows are
isolated on that tenant's own ``IsolationBudget``: one tenant's failing rows never cost
another tenant calls or hold its rows back. A single tenant's refused group is split in
halves (each padded back to the full size by the call) until the failing rows are alone; a
row that still fails alone is retried up to ``max_attempts`` calls in all, then fails with
its dead letter. Once a tenant's budget is spent, its refused rows fail at once."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from numpy.typing import NDArray

from brimful.core import metrics
from brimful.core.clock import now_ms
from brimful.core.model_catalogue import ModelSignature
from brimful.core.stats import SharedStats, StatsField
from brimful.core.task_store import TaskStore
from brimful.core.tensor_codec import row_mismatch
from brimful.schemas import Attempt
from brimful.workers.batch import Batch, BatchItem, BatchOutcome, Seat
from brimful.workers.batch_rows import known_tasks
from brimful.workers.dead_letters import DeadLetterWriter, dead_letter
from brimful.workers.isolation_budget import IsolationBudget
from brimful.workers.model_errors import ErrorClass, ModelCallError, TransientOutageTooLong
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


Outputs = dict[str, NDArray[Any]]
# call(batch, seat, rows, attempts, outcome, isolating): one successful call through any
# outage; raises ModelCallError for what the model refused, TransientOutageTooLong when
# the outage outlasted its bound.
Call = Callable[[Batch, Seat, list[BatchItem], Attempts, BatchOutcome, bool], Awaitable[Outputs]]
# store(batch, rows, outputs, attempts, outcome): the call's results, stored.
Store = Callable[[Batch, list[BatchItem], Outputs, Attempts, BatchOutcome], Awaitable[None]]
# fail(batch, rows, error, attempts, outcome): the rows fail, with their dead letters.
Fail = Callable[[Batch, list[BatchItem], ModelCallError, Attempts, BatchOutcome], Awaitable[None]]


class Isolation:
    """Brings every row of a batch to done or failed (see the module's docstring)."""

    def __init__(
        self,
        call: Call,
        store: Store,
        fail: Fail,
        retry: BatchRetryPolicy,
        budget: IsolationBudget,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self._call = call
        self._store = store
        self._fail = fail
        self.retry = retry
        self.budget = budget
        self._clock = clock
        self._sleep = sleep

    async def resolve(
        self,
        batch: Batch,
        seat: Seat,
        items: list[BatchItem],
        attempts: Attempts,
        outcome: BatchOutcome,
        isolating: bool = False,
    ) -> None:
        """Call the model with ``items`` and store what comes back, splitting on refusals."""
        non_transient_calls = 0
        while True:
            if isolating:  # only single-tenant groups are isolated: see the tenant split below
                tenant = items[0].request.tenant
                if not self.budget.take(tenant, self._clock()):
                    error = ModelCallError(
                        ErrorClass.MODEL_ERROR,
                        f"the model refused a batch holding this row, and tenant {tenant!r} has spent its budget of "
                        "calls to find which of its rows fail; retry later or replay from the DLQ",
                    )
                    attempts.record(items, error)
                    await self._fail(batch, items, error, attempts, outcome)
                    return
            try:
                outputs = await self._call(batch, seat, items, attempts, outcome, isolating)
            except TransientOutageTooLong as gave_up:
                await self._fail(batch, items, gave_up.error, attempts, outcome)
                return
            except ModelCallError as error:
                non_transient_calls += 1
                tenants = sorted({item.request.tenant for item in items})
                if len(tenants) > 1:
                    for tenant in tenants:
                        group = [item for item in items if item.request.tenant == tenant]
                        await self.resolve(batch, seat, group, attempts, outcome, isolating=True)
                    return
                if len(items) > 1:
                    middle = len(items) // 2
                    log.warning(
                        "model refused a batch; splitting it to find the failing rows",
                        extra={"batch_id": batch.batch_id, "rows": len(items), "error": error.message},
                    )
                    for half in (items[:middle], items[middle:]):
                        await self.resolve(batch, seat, half, attempts, outcome, isolating=True)
                    return
                delay = self.retry.delay_before(non_transient_calls + 1)
                if delay is None:
                    await self._fail(batch, items, error, attempts, outcome)
                    return
                metrics.MODEL_RETRIES.labels("model_error").inc()
                await self._sleep(delay)
                continue
            await self._store(batch, items, outputs, attempts, outcome)
            return
