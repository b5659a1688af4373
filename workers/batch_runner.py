"""Run one batch: pad it to the model's size, call the model, unpad, store every result.

Failures are handled by class (``brimful.workers.model_errors``):

- **transient** (server unreachable, timeout, model still loading): the call moves at
  once to another endpoint of the pool (``ModelPool``) if one has a free slot, else waits
  a backoff; each endpoint's circuit breaker hears it, and the batcher pauses consumption
  while every circuit is open. Such retries use up no attempts, so an outage sends
  nothing to the DLQ. Only an outage longer than ``transient_give_up_s`` does.
- **the model rejects the batch** (model error, malformed request): the failing rows are
  isolated (``workers/task_failures.py``) and fail with their dead letters
  (``workers/task_failures.py``); the good rows complete.

Identical tasks are computed once (``workers/shared_rows.py``). Running the same batch
twice is harmless: final tasks are skipped and the store lets a task reach a final state
once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from numpy.typing import NDArray

from brimful.core import metrics
from brimful.core.clock import now_ms
from brimful.core.model_catalogue import ModelSignature, non_finite_rows, output_rows_to_json, stack_rows
from brimful.core.stats import SharedStats, StatsField
from brimful.core.task_provenance import CallFacts, StoredProvenance
from brimful.core.task_store import TaskStore
from brimful.core.tracing import BatchTrace, TracedTask, Tracing
from brimful.core.webhook_records import TaskEvents
from brimful.workers.batch import (
    Batch,
    BatchItem,
    BatchOutcome,
    Seat,
    call_facts,
    expire_late,
    known_tasks,
    observe_latency,
    recreate_missing,
)
from brimful.workers.dead_letters import DeadLetterWriter
from brimful.workers.isolation_budget import IsolationBudget
from brimful.workers.model_errors import ErrorClass, ModelCallError, TransientOutageTooLong
from brimful.workers.model_pool import ModelPool
from brimful.workers.retry_policy import BatchRetryPolicy
from brimful.workers.shared_rows import Followers, Group, ResultCache, SharedRows
from brimful.workers.slot import Slot
from brimful.workers.task_failures import Attempts, Isolation, TaskFailures
from brimful.workers.triton_model import pad_batch, unpad

log = logging.getLogger("brimful.worker")


def _ignore_outcome(task: asyncio.Future[Any]) -> None:
    # A lease given up on: its error, if any, is read here rather than reported as never retrieved.
    if not task.cancelled():
        task.exception()


class BatchRunner:
    """Executes batches on the model pool; shared by all partitions of a batcher."""

    def __init__(
        self,
        pool: ModelPool,
        signature: ModelSignature,
        store: TaskStore,
        stats: SharedStats,
        dead_letters: DeadLetterWriter,
        retry: BatchRetryPolicy,
        transient_give_up_s: float = 900.0,
        isolation: IsolationBudget | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = now_ms,
        tracing: Tracing | None = None,
        cache: ResultCache | None = None,
        cacheable: bool = True,
        cache_across_tenants: bool = False,
        task_events: TaskEvents | None = None,
        provenance: bool = True,
    ) -> None:
        """``cache``: finished results kept for identical tasks (None: none kept; identical
        tasks of one batch are still computed once). ``cacheable`` False (a model that is
        not deterministic): every task is computed, none shares a result. ``provenance``:
        store each done task's (``core/task_provenance.py``) with its outputs."""
        self.pool = pool
        self.signature = signature
        self.store = store
        self.stats = stats
        self.retry = retry
        self.transient_give_up_s = transient_give_up_s
        self._sleep = sleep
        self._clock = clock
        self._wall_ms = wall_ms  # the wall clock deadlines are set on
        self.tracing = tracing
        self.cacheable = cacheable
        self.task_events = task_events  # the webhooks of finished tasks (None: none announced)
        self.provenance = provenance
        self.shared = SharedRows(signature, store, cache, cache_across_tenants)
        self.failures = TaskFailures(signature, store, stats, dead_letters, self.shared)
        self.isolation = Isolation(retry, isolation or IsolationBudget(), clock)

    async def run(self, batch: Batch) -> BatchOutcome:
        """Run the batch to a final state for every task in it; raises only on store or
        broker errors, after which running it again is safe."""
        outcome = BatchOutcome()
        outcome.stats[StatsField.flushes(batch.reason)] += 1
        if self.provenance:
            outcome.answered_provenance = StoredProvenance(call_facts(batch, outcome, 0, self.signature.batch_size))
        slot, batch.slot = batch.slot, None  # a run repeated after a store error takes a new one
        seat = Seat(slot)
        run = _Run(batch, seat, outcome)
        try:
            candidates = await expire_late(self.store, batch, outcome, self._wall_ms())
            # Only tasks that this atomic move takes from queued to running reach the model:
            # tasks already final (redelivered) or cancelled are left out.
            running = set(await self._mark_running_while_leasing(candidates, seat))
            if len(running) < len(candidates):
                running.update(await recreate_missing(self.store, batch, candidates, running, self.signature.name))
                await self.store.leave_in_flight_if_final(
                    [(item.task_id, item.request.tenant) for item in candidates if item.task_id not in running]
                )
            items = [item for item in candidates if item.task_id in running]
            outcome.skipped = len(candidates) - len(items)
            items = await self.failures.fail_unfit(batch, items, outcome)
            computed, followers = await self.shared.answer_identical(items, outcome) if self.cacheable else (items, [])
            if followers:
                if not computed:
                    # Waiting for rows other batches compute holds no model slot: the batch
                    # computing them may need one again (to retry or split), and batches that
                    # wait on it must never hold every slot it could take.
                    self._leave_seat(seat)
                # Rows whose computing batch failed or stopped come back: computed here after all.
                orphans = await self._follow_beside(run, computed, followers)
                computed = self.shared.lead(orphans, outcome)
            if computed:
                await self._resolve(run, computed)
        finally:
            if seat.slot is not None:
                self.pool.release(seat.slot)
            self.shared.release(outcome)  # what it never computed, its followers compute
        if any(outcome.stats.values()):  # what no store call carried (a batch with no result)
            await self.stats.add(outcome.stats)
        _observe_stages(batch, outcome)
        if self.task_events is not None:
            await self.task_events.announce([item.request for item in batch.items])
        self._report(batch, items, outcome)
        return outcome

    def _report(self, batch: Batch, items: list[BatchItem], outcome: BatchOutcome) -> None:
        """The batch's trace and its log line."""
        if self.tracing is not None:
            self._trace(batch, items, outcome)
        log.info(
            "batch finished",
            extra={
                "batch_id": batch.batch_id,
                "partition": batch.partition,
                "rows": len(items),
                "reason": batch.reason,
                "done": outcome.done,
                "failed": outcome.failed,
                "skipped": outcome.skipped,
                "expired": outcome.expired,
                "calls": outcome.calls,
                "isolation_calls": outcome.isolation_calls,
            },
        )

    async def _follow_beside(self, run: _Run, computed: list[BatchItem], followers: list[Followers]) -> list[Group]:
        """Compute the batch's own rows while its followers wait for theirs; return the
        followers' groups left to compute."""
        if not computed:
            return await self.shared.follow(followers, run.outcome)
        resolving = asyncio.ensure_future(self._resolve(run, computed))
        try:
            orphans = await self.shared.follow(followers, run.outcome)
        except BaseException:
            resolving.cancel()
            await asyncio.gather(resolving, return_exceptions=True)
            raise
        await resolving
        return orphans

    async def _mark_running_while_leasing(self, items: list[BatchItem], seat: Seat) -> list[str]:
        """Mark the batch's tasks running while its slot is leased across batchers: the call
        needs both, and the two round trips to Redis overlap (where the client's own CPU
        dominates, as on two shared cores, they still take nearly the time of two: 0.8-0.9
        against 0.4-0.5 ms at idle). ``seat`` ends holding the slot to give back (None if
        none is held)."""
        task_ids = [item.task_id for item in items]
        if not task_ids:
            return []
        if seat.slot is None or seat.slot.leased or not self.pool.leasing:
            return await self.store.mark_running(task_ids)
        securing = asyncio.ensure_future(self.pool.secure(seat.slot, len(items)))
        try:
            running = await self.store.mark_running(task_ids)
        except BaseException:
            if securing.done() and not securing.cancelled() and securing.exception() is None:
                seat.slot = securing.result()  # leased: given back by the caller
            else:
                securing.cancel()  # a slot it moved to, it gives back itself
                if not securing.done():
                    securing.add_done_callback(_ignore_outcome)
                self.pool.abandon(seat.slot)
                seat.slot = None
            raise
        seat.slot = await securing
        return running

    def _trace(self, batch: Batch, items: list[BatchItem], outcome: BatchOutcome) -> None:
        assert self.tracing is not None
        traced = [TracedTask(i.task_id, i.trace_headers, i.arrived_ns) for i in items if i.trace_headers]
        if traced:
            self.tracing.record_batch(
                BatchTrace(
                    batch_id=batch.batch_id,
                    flush_reason=batch.reason,
                    partition=batch.partition,
                    flushed_ns=batch.flushed_ns,
                    call_started_ns=outcome.call_started_ns,
                    call_ended_ns=outcome.call_ended_ns,
                    stored_ns=time.time_ns(),
                    endpoint=outcome.endpoint,
                    rows=len(items),
                    calls=outcome.calls,
                ),
                traced,
            )

    async def abandon(self, batch: Batch, error: BaseException) -> None:
        """Give up a batch that keeps failing for a reason other than the model (a fault
        in Brimful or in what it was given): every task of it not yet final fails, with
        its dead letter. Safe to repeat."""
        if batch.slot is not None:
            self.pool.release(batch.slot)
            batch.slot = None
        unfinished = set(await self.store.unfinished(item.task_id for item in batch.items))
        items = [item for item in batch.items if item.task_id in unfinished]
        if items:
            failure = ModelCallError(ErrorClass.INTERNAL, f"{type(error).__name__}: {error}"[:500])
            await self.failures.fail(batch, items, failure, Attempts(), BatchOutcome())
        log.error("batch given up", extra={"batch_id": batch.batch_id, "tasks": len(items), "error": repr(error)})

    async def _resolve(self, run: _Run, items: list[BatchItem], isolating: bool = False) -> None:
        """Call the model with ``items`` and store what comes back; rows it refuses are
        isolated as ``self.isolation`` decides, until each is done or failed."""
        refusals = 0
        while True:
            over = self.isolation.over_budget(items) if isolating else None
            if over is not None:
                run.attempts.record(items, over)
                await self.failures.fail(run.batch, items, over, run.attempts, run.outcome)
                return
            try:
                outputs = await self._call_through_outages(run, items, isolating)
            except TransientOutageTooLong as gave_up:
                await self.failures.fail(run.batch, items, gave_up.error, run.attempts, run.outcome)
                return
            except ModelCallError as error:
                refusals += 1
                refusal = self.isolation.after_refusal(items, refusals)
                if refusal.groups:
                    log.warning(
                        "model refused a batch; splitting it to find the failing rows",
                        extra={"batch_id": run.batch.batch_id, "rows": len(items), "error": error.message},
                    )
                for group in refusal.groups:
                    await self._resolve(run, group, isolating=True)
                if refusal.groups:
                    return
                if refusal.retry_in_s is None:
                    await self.failures.fail(run.batch, items, error, run.attempts, run.outcome)
                    return
                metrics.MODEL_RETRIES.labels("model_error").inc()
                await self._sleep(refusal.retry_in_s)
                continue
            await self._store_outputs(run, items, outputs)
            return

    async def _call_through_outages(
        self, run: _Run, items: list[BatchItem], isolating: bool
    ) -> dict[str, NDArray[Any]]:
        """One successful call, waiting out transient failures; raises ModelCallError
        for what the model itself refused."""
        batch, seat, outcome = run.batch, run.seat, run.outcome
        inputs = {
            spec.name: stack_rows(spec, [item.request.inputs[spec.name] for item in items])
            for spec in self.signature.inputs
        }
        padded = pad_batch(inputs, self.signature.batch_size)
        call_stats = {
            StatsField.BATCHES_DISPATCHED: 1,
            StatsField.ROWS_DISPATCHED: len(items),
            StatsField.PADDED_SLOTS: self.signature.batch_size - len(items),
        }
        outage = _Outage()
        while True:
            seat.slot = await self.pool.secure(seat.slot or await self.pool.acquire(len(items)), len(items))
            started, started_ns = self._begin_call(batch, seat.slot, len(items), outcome, isolating)
            try:
                outputs = await self._call(seat.slot, padded)
            except ModelCallError as error:
                run.attempts.record(items, error)
                # The endpoint's breaker hears the outcome before any I/O that could fail: a
                # probe whose result it never heard would keep the door shut. A refusal is an
                # answer: the endpoint serves, the batch is the problem.
                self.pool.record_call(seat.slot, started, len(items), transient_failure=error.error_class.is_transient)
                if not error.error_class.is_transient:
                    self._leave_seat(seat)
                await self.stats.add({**call_stats, StatsField.CALLS_FAILED: 1})
                if not error.error_class.is_transient:
                    raise
                await self._wait_out(batch, seat, len(items), error, outage)
                continue
            self.pool.record_call(seat.slot, started, len(items), transient_failure=False)
            outcome.call_started_ns, outcome.call_ended_ns = started_ns, time.time_ns()
            outcome.endpoint = seat.slot.endpoint.url
            metrics.ENDPOINT_ROWS.labels(seat.slot.endpoint.url).inc(len(items))
            self._leave_seat(seat)  # its lease goes back while the results are stored
            outcome.stats.update(call_stats)
            return outputs

    def _begin_call(
        self, batch: Batch, slot: Slot, rows: int, outcome: BatchOutcome, isolating: bool
    ) -> tuple[float, int]:
        """Count a call about to start; its start on the clock and in wall nanoseconds."""
        outcome.calls += 1
        if isolating:
            outcome.isolation_calls += 1
            metrics.ISOLATION_CALLS.inc()
        partition = str(batch.partition)
        metrics.BATCH_ROWS.labels(partition).observe(rows)
        metrics.PADDED_SLOTS.labels(partition).inc(self.signature.batch_size - rows)
        started, started_ns = self._clock(), time.time_ns()
        first_call = outcome.calls == 1 and batch.flushed_ns
        self.pool.call_begins(slot, rows, (started_ns - batch.flushed_ns) / 1e9 if first_call else None)
        return started, started_ns

    async def _wait_out(self, batch: Batch, seat: Seat, rows: int, error: ModelCallError, outage: _Outage) -> None:
        """After a transient failure: give up past ``transient_give_up_s`` of outage
        (TransientOutageTooLong), else back off if no other endpoint can take the call now,
        and move to the endpoint expected to answer soonest."""
        assert seat.slot is not None
        now = self._clock()
        outage.started = outage.started if outage.started is not None else now
        if now - outage.started > self.transient_give_up_s:
            self._leave_seat(seat)
            raise TransientOutageTooLong(error) from error
        outage.retries += 1
        metrics.MODEL_RETRIES.labels("transient").inc()
        failed_at = seat.slot.endpoint
        log.warning(
            "model endpoint unreachable; will retry",
            extra={
                "batch_id": batch.batch_id,
                "endpoint": failed_at.url,
                "error_class": error.error_class.value,
                "error": error.message,
                "breaker": failed_at.breaker.state(now).value,
            },
        )
        if not self.pool.can_switch_now():
            # No other endpoint can take it now: back off before trying again.
            await self._sleep(self.retry.delay_before(min(outage.retries + 1, self.retry.max_attempts)) or 0.0)
        seat.slot = await self.pool.switch(seat.slot, rows)

    def _leave_seat(self, seat: Seat) -> None:
        if seat.slot is not None:
            slot, seat.slot = seat.slot, None
            self.pool.release(slot)

    async def _call(self, slot: Slot, padded: dict[str, NDArray[Any]]) -> dict[str, NDArray[Any]]:
        endpoint = slot.endpoint.url
        try:
            outputs = await slot.model.infer(padded, self.signature)
        except ModelCallError as error:
            metrics.MODEL_CALLS.labels(endpoint, error.error_class.value).inc()
            raise
        metrics.MODEL_CALLS.labels(endpoint, "ok").inc()
        return outputs

    async def _store_outputs(self, run: _Run, items: list[BatchItem], outputs: dict[str, NDArray[Any]]) -> None:
        outcome = run.outcome
        facts = call_facts(run.batch, outcome, len(items), self.signature.batch_size) if self.provenance else None
        outputs = unpad(outputs, len(items))
        unfit = non_finite_rows(self.signature.outputs, outputs)
        if unfit:
            # JSON has no NaN or infinity: such a row's task fails with the reason, and
            # its neighbours keep their results.
            for row, name in sorted(unfit.items()):
                error = ModelCallError(ErrorClass.MODEL_ERROR, f"the model's output {name} holds NaN or infinity")
                run.attempts.record([items[row]], error)
                await self.failures.fail(run.batch, [items[row]], error, run.attempts, outcome)
            keep = [row for row in range(len(items)) if row not in unfit]
            items = [items[row] for row in keep]
            outputs = {name: array[keep] for name, array in outputs.items()}
        columns = {spec.name: output_rows_to_json(spec, outputs[spec.name]) for spec in self.signature.outputs}
        results = {
            item.task_id: {name: column[row] for name, column in columns.items()} for row, item in enumerate(items)
        }
        # Each result's JSON made once: it is stored, sized for the cache, and copied to twins.
        encoded = {task_id: orjson.dumps(result) for task_id, result in results.items()}
        shared, twins = self.shared.computed(outcome, items, results, encoded)
        # The batch's counters so far ride along with its results: one round trip for both.
        known = known_tasks(items + twins, self.signature.name)
        provenance = _provenance(facts, items + twins)
        done = await self.store.mark_done(
            encoded, outcome.stats, done_counter=StatsField.TASKS_DONE, known=known, provenance=provenance
        )
        outcome.stats.clear()
        outcome.done += done
        if shared:
            outcome.done += await self.store.mark_done(
                shared, done_counter=StatsField.TASKS_DONE, cached=True, known=known, provenance=provenance
            )
        observe_latency(items + twins)


def _provenance(facts: CallFacts | None, items: list[BatchItem]) -> dict[str, bytes] | None:
    """Each task's stored provenance from its call's facts, by id (None: provenance is off)."""
    if facts is None:
        return None
    stored = StoredProvenance(facts)
    return {item.task_id: stored.of(item.arrived_ns) for item in items}


@dataclass
class _Run:
    """One run of a batch: the batch, the seat its calls hold, what it did, and the failed
    calls of each of its tasks so far (for their dead letters)."""

    batch: Batch
    seat: Seat
    outcome: BatchOutcome
    attempts: Attempts = field(default_factory=Attempts)


@dataclass
class _Outage:
    """A call's transient failures so far: when the first came, and how many."""

    started: float | None = None
    retries: int = 0


def _observe_stages(batch: Batch, outcome: BatchOutcome) -> None:
    """Where a batch's time went once its results are stored (``brimful_batch_stage_seconds``):
    on the common path of one call only, since retries and splits would blur the stages."""
    if outcome.calls == 1 and outcome.call_ended_ns and batch.flushed_ns:
        stored_ns = time.time_ns()
        metrics.BATCH_STAGE.labels("prepare").observe(max(0, outcome.call_started_ns - batch.flushed_ns) / 1e9)
        metrics.BATCH_STAGE.labels("call").observe(max(0, outcome.call_ended_ns - outcome.call_started_ns) / 1e9)
        metrics.BATCH_STAGE.labels("store").observe(max(0, stored_ns - outcome.call_ended_ns) / 1e9)
