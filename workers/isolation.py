"""Finding the rows that make the model refuse a batch, so the rest complete.

A refused batch of several tenants is split by tenant first, and each tenant's rows are
isolated on that tenant's own ``IsolationBudget``: one tenant's failing rows never cost
another tenant calls or hold its rows back. A single tenant's refused group is split in
halves (each padded back to the full size by the call) until the failing rows are alone; a
row that still fails alone is retried up to ``max_attempts`` calls in all, then fails with
its dead letter. Once a tenant's budget is spent, its refused rows fail at once."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from numpy.typing import NDArray

from brimful.core import metrics
from brimful.workers.batch import Batch, BatchItem, BatchOutcome, Seat
from brimful.workers.isolation_budget import IsolationBudget
from brimful.workers.model_errors import ErrorClass, ModelCallError, TransientOutageTooLong
from brimful.workers.retry_policy import BatchRetryPolicy
from brimful.workers.task_failures import Attempts

log = logging.getLogger("brimful.worker")

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
