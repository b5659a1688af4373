"""Run one batch: pad it to the model's size, call the model, unpad, store every result.

Failures are handled by class (``brimful.workers.model_errors``):

- **transient** (server unreachable, timeout, model still loading): the call moves at
  once to another endpoint of the pool (``ModelPool``) if one has a free slot, else waits
  a backoff; each endpoint's circuit breaker hears it, and the batcher pauses consumption
  while every circuit is open. Such retries use up no attempts, so an outage sends
  nothing to the DLQ. Only an outage longer than ``transient_give_up_s`` does.
- **the model rejects the batch** (model error, malformed request): the batch is split in
  halves, each padded back to the full size, until the failing rows are alone; the good
  rows complete. A row that still fails alone is retried up to ``max_attempts`` calls in
  all, then its task becomes ``failed`` and its request goes to the DLQ. A refused batch
  of several tenants is split by tenant first, and every call made to isolate a tenant's
  rows is charged to that tenant's ``IsolationBudget``; once it is spent, that tenant's
  refused rows fail at once.

Identical tasks (the same model, version, inputs and, unless results may cross tenants,
tenant: ``workers/result_cache.py``) are computed once: a task whose result the batcher's
cache holds is answered from it; of the identical tasks in one batch the model sees one
row, whose result or failure every one of them gets; and a task identical to one that
another batch of this batcher is computing waits for that row's result (if that row
fails, the waiting task is computed in its own batch: a failure is never shared beyond
the batch). A task may opt out, and a model may be marked not cacheable.

Running the same batch twice is harmless: final tasks are skipped and the store lets a
task reach a final state once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from brimful.core import metrics
from brimful.core.clock import now_ms
from brimful.core.model_signature import ModelSignature
from brimful.core.stats import SharedStats, StatsField
from brimful.core.task_store import KnownTask, TaskStore
from brimful.core.tensor_codec import non_finite_rows, output_rows_to_json, row_mismatch, stack_rows
from brimful.core.tracing import BatchTrace, TracedTask, Tracing
from brimful.schemas import Attempt, TaskRequest
from brimful.workers.dead_letters import DeadLetterWriter, dead_letter
from brimful.workers.isolation_budget import IsolationBudget
from brimful.workers.model_errors import ErrorClass, ModelCallError
from brimful.workers.model_pool import ModelPool, Slot
from brimful.workers.padding import pad_batch, unpad
from brimful.workers.result_cache import ResultCache, cache_key, plan_batch
from brimful.workers.retry_policy import BatchRetryPolicy

log = logging.getLogger("brimful.worker")


@dataclass(frozen=True)
class BatchItem:
    """One task in a batch, with where it came from."""

    request: TaskRequest
    partition: int
    offset: int
    trace_headers: tuple[tuple[str, bytes], ...] = ()  # the task's trace context (tracing on)
    arrived_ns: int = 0  # when the batcher fetched it, wall clock

    @property
    def task_id(self) -> str:
        return self.request.task_id


@dataclass
class Batch:
    """Rows flushed together from one partition."""

    batch_id: str
    partition: int
    items: list[BatchItem]
    reason: str
    slot: Slot | None = None  # the model slot taken when it was dispatched; used by its first run
    flushed_ns: int = 0  # when it left its accumulator, wall clock


@dataclass
class _Seat:
    """The slot a running batch holds while it calls the model (None between calls: its
    Redis and broker work leaves the endpoint to others); a transient failure moves it to
    another endpoint."""

    slot: Slot | None


@dataclass
class BatchOutcome:
    """What running a batch did."""

    done: int = 0
    failed: int = 0
    skipped: int = 0
    calls: int = 0
    isolation_calls: int = 0  # calls made on halves to find poison rows
    # Shared counters of the flush and of the calls that went through, not yet in Redis: they
    # go with the batch's results in the same round trip (the tasks done are counted there),
    # or when the batch ends (failures are added at once: an outage shows live).
    stats: Counter[str] = field(default_factory=Counter)
    # The last successful model call, wall clock (for traces).
    call_started_ns: int = 0
    call_ended_ns: int = 0
    endpoint: str = ""
    # The result cache's view of the rows the model computes: each one's key, and the
    # identical tasks that share its result (by the computed task's id).
    keys: dict[str, bytes] = field(default_factory=dict)
    twins: dict[str, list[BatchItem]] = field(default_factory=dict)
    # The keys this batch computes for other batches too, with the result they wait on.
    leading: dict[bytes, asyncio.Future[dict[str, Any] | None]] = field(default_factory=dict)


@dataclass
class _Followers:
    """Identical tasks of this batch whose row another batch is computing right now."""

    key: bytes
    computing: asyncio.Future[dict[str, Any] | None]  # its result; None: that row failed or its batch stopped
    items: list[BatchItem]


@dataclass
class _Attempts:
    """Failed calls per task, for the dead letters."""

    by_task: dict[str, list[Attempt]] = field(default_factory=dict)

    def record(self, items: list[BatchItem], error: ModelCallError) -> None:
        attempt = Attempt(at_ms=now_ms(), error_class=error.error_class.value, error_message=error.message)
        for item in items:
            self.by_task.setdefault(item.task_id, []).append(attempt)

    def of(self, item: BatchItem) -> list[Attempt]:
        return self.by_task.get(item.task_id, [])


class TransientOutageTooLong(Exception):
    """Transient failures outlasted ``transient_give_up_s``."""

    def __init__(self, error: ModelCallError) -> None:
        super().__init__(str(error))
        self.error = error


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
        tracing: Tracing | None = None,
        cache: ResultCache | None = None,
        cacheable: bool = True,
        cache_across_tenants: bool = False,
    ) -> None:
        """``cache``: finished results kept for identical tasks (None: none kept; identical
        tasks of one batch are still computed once). ``cacheable`` False (a model that is
        not deterministic): every task is computed, none shares a result."""
        self.pool = pool
        self.signature = signature
        self.store = store
        self.stats = stats
        self.dead_letters = dead_letters
        self.retry = retry
        self.transient_give_up_s = transient_give_up_s
        self.isolation = isolation or IsolationBudget()
        self._sleep = sleep
        self._clock = clock
        self.tracing = tracing
        self.cache = cache
        self.cacheable = cacheable
        self.cache_across_tenants = cache_across_tenants
        # Keys some running batch is computing now: a later batch's identical task waits
        # for that result instead of computing it again.
        self._computing: dict[bytes, asyncio.Future[dict[str, Any] | None]] = {}

    async def run(self, batch: Batch) -> BatchOutcome:
        """Run the batch to a final state for every task in it; raises only on store or
        broker errors, after which running it again is safe."""
        outcome = BatchOutcome()
        outcome.stats[StatsField.flushes(batch.reason)] += 1
        slot, batch.slot = batch.slot, None  # a run repeated after a store error takes a new one
        seat = _Seat(slot)
        try:
            # Only tasks that this atomic move takes from queued to running reach the model:
            # tasks already final (redelivered) or cancelled are left out.
            running = set(await self._mark_running_while_leasing(batch, seat))
            if len(running) < len(batch.items):
                running.update(await self._recreate_missing(batch, running))
            items = [item for item in batch.items if item.task_id in running]
            outcome.skipped = len(batch.items) - len(items)
            items = await self._fail_unfit(batch, items, outcome)
            computed, followers = await self._answer_identical(items, outcome) if self.cacheable else (items, [])
            if followers:
                if not computed:
                    # Waiting for rows other batches compute holds no model slot: the batch
                    # computing them may need one again (to retry or split), and batches that
                    # wait on it must never hold every slot it could take.
                    self._leave_seat(seat)
                # Rows whose computing batch failed or stopped come back: computed here after all.
                orphans = await self._follow_beside(batch, seat, computed, followers, outcome)
                computed = self._lead(orphans, outcome)
            if computed:
                await self._resolve(batch, seat, computed, _Attempts(), outcome, isolating=False)
        finally:
            if seat.slot is not None:
                self.pool.release(seat.slot)
            for key in list(outcome.leading):  # what it never computed, its followers compute
                self._settle(outcome, key, None)
        if any(outcome.stats.values()):  # what no store call carried (a batch with no result)
            await self.stats.add(outcome.stats)
        if (
            outcome.calls == 1 and outcome.call_ended_ns and batch.flushed_ns
        ):  # the common path; retries and splits would blur the stages
            stored_ns = time.time_ns()
            metrics.BATCH_STAGE.labels("prepare").observe(max(0, outcome.call_started_ns - batch.flushed_ns) / 1e9)
            metrics.BATCH_STAGE.labels("call").observe(max(0, outcome.call_ended_ns - outcome.call_started_ns) / 1e9)
            metrics.BATCH_STAGE.labels("store").observe(max(0, stored_ns - outcome.call_ended_ns) / 1e9)
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
                "calls": outcome.calls,
                "isolation_calls": outcome.isolation_calls,
            },
        )
        return outcome

    async def _recreate_missing(self, batch: Batch, running: set[str]) -> list[str]:
        """Bring back the tasks of the batch whose record Redis lost (the Kafka record is
        the source of truth): they run with the rest, and their tenant's quota frees when
        they end. Final, cancelled and withdrawn tasks stay as they are."""
        left = [
            KnownTask(
                item.task_id,
                item.request.submitted_at_ms,
                item.request.tenant,
                item.request.model or self.signature.name,
            )
            for item in batch.items
            if item.task_id not in running
        ]
        recreated = await self.store.recreate_missing(left)
        if recreated:
            metrics.TASKS_RECREATED.inc(len(recreated))
            for task_id in recreated:
                log.warning(
                    "task record was gone; re-created from its Kafka record",
                    extra={"task_id": task_id, "batch_id": batch.batch_id},
                )
        return recreated

    async def _fail_unfit(self, batch: Batch, items: list[BatchItem], outcome: BatchOutcome) -> list[BatchItem]:
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
            await self._fail(batch, group, error, _Attempts(), outcome)
        return fit

    def _key(self, item: BatchItem) -> bytes | None:
        return cache_key(item.request, self.signature.name, self.signature.version, self.cache_across_tenants)

    async def _answer_identical(
        self, items: list[BatchItem], outcome: BatchOutcome
    ) -> tuple[list[BatchItem], list[_Followers]]:
        """Answer the tasks whose result the cache holds, note the identical ones among the
        rest, and return the rows the model must compute (one per distinct task) and the
        tasks that wait for a row another batch is computing."""
        cache = self.cache
        plan = plan_batch(items, self._key, lambda key: None if cache is None else cache.get(key))
        own: list[tuple[bytes | None, list[BatchItem]]] = []
        followers: list[_Followers] = []
        for row, (item, key) in enumerate(zip(plan.computed, plan.keys)):
            group = [item, *plan.duplicates.get(row, ())]
            computing = None if key is None else self._computing.get(key)
            if key is None or computing is None:
                own.append((key, group))
            else:
                followers.append(_Followers(key, computing, group))
        computed = self._lead(own, outcome)
        outcome.stats[StatsField.CACHE_HITS] += len(plan.hits)
        metrics.CACHE_HITS.inc(len(plan.hits))
        if plan.hits:
            # The batch's counters so far ride along: the round trip is needed anyway.
            outcome.done += await self.store.mark_done(
                {item.task_id: outputs for item, outputs in plan.hits},
                outcome.stats,
                done_counter=StatsField.TASKS_DONE,
                cached=True,
            )
            outcome.stats.clear()
            self._observe_latency([item for item, _ in plan.hits])
        return computed, followers

    def _lead(self, groups: list[tuple[bytes | None, list[BatchItem]]], outcome: BatchOutcome) -> list[BatchItem]:
        """The rows this batch computes, one per group of identical tasks (with its key, if
        it has one): noted so the group's other tasks share its result and, while it is
        computed, so later batches' identical tasks wait for it."""
        rows: list[BatchItem] = []
        hits = misses = 0
        for key, (item, *twins) in groups:
            rows.append(item)
            if key is None:
                continue
            outcome.keys[item.task_id] = key
            if twins:
                outcome.twins[item.task_id] = twins
            if key not in self._computing:
                future: asyncio.Future[dict[str, Any] | None] = asyncio.get_running_loop().create_future()
                self._computing[key] = outcome.leading[key] = future
            hits += len(twins)
            misses += 1
        # Counted once a batch, not once a row: this is on every batch's path.
        outcome.stats[StatsField.CACHE_HITS] += hits
        outcome.stats[StatsField.CACHE_MISSES] += misses
        metrics.CACHE_HITS.inc(hits)
        metrics.CACHE_MISSES.inc(misses)
        return rows

    async def _follow_beside(
        self, batch: Batch, seat: _Seat, computed: list[BatchItem], followers: list[_Followers], outcome: BatchOutcome
    ) -> list[tuple[bytes | None, list[BatchItem]]]:
        """Compute the batch's own rows while its followers wait for theirs; return the
        followers' groups left to compute."""
        if not computed:
            return await self._follow(followers, outcome)
        resolving = asyncio.ensure_future(self._resolve(batch, seat, computed, _Attempts(), outcome, isolating=False))
        try:
            orphans = await self._follow(followers, outcome)
        except BaseException:
            resolving.cancel()
            await asyncio.gather(resolving, return_exceptions=True)
            raise
        await resolving
        return orphans

    async def _follow(
        self, followers: list[_Followers], outcome: BatchOutcome
    ) -> list[tuple[bytes | None, list[BatchItem]]]:
        """Store each waiting group's result as the batch computing it finishes; return the
        groups whose row failed or whose batch stopped, to be computed here."""
        orphans: list[tuple[bytes | None, list[BatchItem]]] = []
        # asyncio.wait never cancels what it waits on: if this batch stops, the computing
        # batch is untouched.
        pending = {group.computing for group in followers}
        while pending:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            answered: dict[str, dict[str, Any]] = {}
            items: list[BatchItem] = []
            for group in followers:
                if group.computing not in finished:
                    continue
                result = group.computing.result()
                if result is None:
                    orphans.append((group.key, group.items))
                    continue
                answered.update((item.task_id, result) for item in group.items)
                items += group.items
            if answered:
                hits = Counter({StatsField.CACHE_HITS: len(answered)})
                outcome.done += await self.store.mark_done(
                    answered, hits, done_counter=StatsField.TASKS_DONE, cached=True
                )
                metrics.CACHE_HITS.inc(len(answered))
                self._observe_latency(items)
        return orphans

    def _settle(self, outcome: BatchOutcome, key: bytes, result: dict[str, Any] | None) -> None:
        """Give the batches waiting on ``key`` its result (None: compute it yourselves)."""
        future = outcome.leading.pop(key, None)
        if future is None:
            return
        if self._computing.get(key) is future:
            del self._computing[key]
        if not future.done():
            future.set_result(result)

    @staticmethod
    def _observe_latency(items: list[BatchItem]) -> None:
        finished_ms = now_ms()
        for item in items:
            metrics.TASK_LATENCY.observe(max(0, finished_ms - item.request.submitted_at_ms) / 1000)

    async def _mark_running_while_leasing(self, batch: Batch, seat: _Seat) -> list[str]:
        """Mark the batch's tasks running while its slot is leased across batchers: the call
        needs both, and the two round trips to Redis overlap (where the client's own CPU
        dominates, as on two shared cores, they still take nearly the time of two: 0.8-0.9
        against 0.4-0.5 ms at idle). ``seat`` ends holding the slot to give back (None if
        none is held)."""
        task_ids = [item.task_id for item in batch.items]
        if seat.slot is None or seat.slot.leased or not self.pool.leasing:
            return await self.store.mark_running(task_ids)
        securing = asyncio.ensure_future(self.pool.secure(seat.slot, len(batch.items)))
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
            await self._fail(batch, items, failure, _Attempts(), BatchOutcome())
        log.error("batch given up", extra={"batch_id": batch.batch_id, "tasks": len(items), "error": repr(error)})

    async def _resolve(
        self,
        batch: Batch,
        seat: _Seat,
        items: list[BatchItem],
        attempts: _Attempts,
        outcome: BatchOutcome,
        isolating: bool,
    ) -> None:
        """Bring every item to done or failed, splitting on model errors."""
        non_transient_calls = 0
        while True:
            if isolating:  # only single-tenant groups are isolated: see the tenant split below
                tenant = items[0].request.tenant
                if not self.isolation.take(tenant, self._clock()):
                    error = ModelCallError(
                        ErrorClass.MODEL_ERROR,
                        f"the model refused a batch holding this row, and tenant {tenant!r} has spent its budget of "
                        "calls to find which of its rows fail; retry later or replay from the DLQ",
                    )
                    attempts.record(items, error)
                    await self._fail(batch, items, error, attempts, outcome)
                    return
            try:
                outputs = await self._call_through_outages(batch, seat, items, attempts, outcome, isolating)
            except TransientOutageTooLong as gave_up:
                await self._fail(batch, items, gave_up.error, attempts, outcome)
                return
            except ModelCallError as error:
                non_transient_calls += 1
                tenants = sorted({item.request.tenant for item in items})
                if len(tenants) > 1:
                    # Each tenant's rows are isolated apart, on its own budget: one tenant's
                    # failing rows never cost another tenant calls or hold its rows back.
                    for tenant in tenants:
                        group = [item for item in items if item.request.tenant == tenant]
                        await self._resolve(batch, seat, group, attempts, outcome, isolating=True)
                    return
                if len(items) > 1:
                    middle = len(items) // 2
                    log.warning(
                        "model refused a batch; splitting it to find the failing rows",
                        extra={"batch_id": batch.batch_id, "rows": len(items), "error": error.message},
                    )
                    for half in (items[:middle], items[middle:]):
                        await self._resolve(batch, seat, half, attempts, outcome, isolating=True)
                    return
                delay = self.retry.delay_before(non_transient_calls + 1)
                if delay is None:
                    await self._fail(batch, items, error, attempts, outcome)
                    return
                metrics.MODEL_RETRIES.labels("model_error").inc()
                await self._sleep(delay)
                continue
            await self._store_outputs(batch, items, outputs, attempts, outcome)
            return

    async def _call_through_outages(
        self,
        batch: Batch,
        seat: _Seat,
        items: list[BatchItem],
        attempts: _Attempts,
        outcome: BatchOutcome,
        isolating: bool,
    ) -> dict[str, np.ndarray]:
        """One successful call, waiting out transient failures; raises ModelCallError
        for what the model itself refused."""
        inputs = {
            spec.name: stack_rows(spec, [item.request.inputs[spec.name] for item in items])
            for spec in self.signature.inputs
        }
        padded = pad_batch(inputs, self.signature.batch_size)
        partition = str(batch.partition)
        call_stats = {
            StatsField.BATCHES_DISPATCHED: 1,
            StatsField.ROWS_DISPATCHED: len(items),
            StatsField.PADDED_SLOTS: self.signature.batch_size - len(items),
        }
        outage_started: float | None = None
        transient_retries = 0
        while True:
            seat.slot = await self.pool.secure(seat.slot or await self.pool.acquire(len(items)), len(items))
            outcome.calls += 1
            if isolating:
                outcome.isolation_calls += 1
                metrics.ISOLATION_CALLS.inc()
            metrics.BATCH_ROWS.labels(partition).observe(len(items))
            metrics.PADDED_SLOTS.labels(partition).inc(self.signature.batch_size - len(items))
            started = self._clock()
            started_ns = time.time_ns()
            first_call = outcome.calls == 1 and batch.flushed_ns
            self.pool.call_begins(seat.slot, len(items), (started_ns - batch.flushed_ns) / 1e9 if first_call else None)
            try:
                outputs = await self._call(seat.slot, padded)
            except ModelCallError as error:
                attempts.record(items, error)
                # The endpoint's breaker hears the outcome before any I/O that could fail: a
                # probe whose result it never heard would keep the door shut. A refusal is an
                # answer: the endpoint serves, the batch is the problem.
                self.pool.record_call(seat.slot, started, len(items), transient_failure=error.error_class.is_transient)
                if not error.error_class.is_transient:
                    self._leave_seat(seat)
                await self.stats.add({**call_stats, StatsField.CALLS_FAILED: 1})
                if not error.error_class.is_transient:
                    raise
                now = self._clock()
                outage_started = outage_started if outage_started is not None else now
                if now - outage_started > self.transient_give_up_s:
                    self._leave_seat(seat)
                    raise TransientOutageTooLong(error) from error
                transient_retries += 1
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
                    await self._sleep(
                        self.retry.delay_before(min(transient_retries + 1, self.retry.max_attempts)) or 0.0
                    )
                seat.slot = await self.pool.switch(seat.slot, len(items))
                continue
            self.pool.record_call(seat.slot, started, len(items), transient_failure=False)
            outcome.call_started_ns, outcome.call_ended_ns = started_ns, time.time_ns()
            outcome.endpoint = seat.slot.endpoint.url
            metrics.ENDPOINT_ROWS.labels(seat.slot.endpoint.url).inc(len(items))
            self._leave_seat(seat)  # its lease goes back while the results are stored
            outcome.stats.update(call_stats)
            return outputs

    def _leave_seat(self, seat: _Seat) -> None:
        if seat.slot is not None:
            slot, seat.slot = seat.slot, None
            self.pool.release(slot)

    async def _call(self, slot: Slot, padded: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        endpoint = slot.endpoint.url
        try:
            outputs = await slot.model.infer(padded, self.signature)
        except ModelCallError as error:
            metrics.MODEL_CALLS.labels(endpoint, error.error_class.value).inc()
            raise
        metrics.MODEL_CALLS.labels(endpoint, "ok").inc()
        return outputs

    async def _store_outputs(
        self,
        batch: Batch,
        items: list[BatchItem],
        outputs: dict[str, np.ndarray],
        attempts: _Attempts,
        outcome: BatchOutcome,
    ) -> None:
        outputs = unpad(outputs, len(items))
        unfit = non_finite_rows(self.signature.outputs, outputs)
        if unfit:
            # JSON has no NaN or infinity: such a row's task fails with the reason, and
            # its neighbours keep their results.
            for row, name in sorted(unfit.items()):
                error = ModelCallError(ErrorClass.MODEL_ERROR, f"the model's output {name} holds NaN or infinity")
                attempts.record([items[row]], error)
                await self._fail(batch, [items[row]], error, attempts, outcome)
            keep = [row for row in range(len(items)) if row not in unfit]
            items = [items[row] for row in keep]
            outputs = {name: array[keep] for name, array in outputs.items()}
        columns = {spec.name: output_rows_to_json(spec, outputs[spec.name]) for spec in self.signature.outputs}
        results = {
            item.task_id: {name: column[row] for name, column in columns.items()} for row, item in enumerate(items)
        }
        shared: dict[str, dict[str, object]] = {}  # the identical tasks' copies of these results
        twins: list[BatchItem] = []
        for item in items:
            key = outcome.keys.get(item.task_id)
            if key is not None:
                if self.cache is not None:
                    self.cache.put(key, results[item.task_id])
                self._settle(outcome, key, results[item.task_id])
            for twin in outcome.twins.get(item.task_id, ()):
                shared[twin.task_id] = results[item.task_id]
                twins.append(twin)
        # The batch's counters so far ride along with its results: one round trip for both.
        done = await self.store.mark_done(results, outcome.stats, done_counter=StatsField.TASKS_DONE)
        outcome.stats.clear()
        outcome.done += done
        if shared:
            outcome.done += await self.store.mark_done(shared, done_counter=StatsField.TASKS_DONE, cached=True)
        if self.cache is not None:
            metrics.CACHE_BYTES.set(self.cache.bytes)
        self._observe_latency(items + twins)

    async def _fail(
        self, batch: Batch, items: list[BatchItem], error: ModelCallError, attempts: _Attempts, outcome: BatchOutcome
    ) -> None:
        # An identical task fails as its computed twin did, with the same attempts: the
        # same inputs to the same model.
        for item in items:
            key = outcome.keys.get(item.task_id)
            if key is not None:
                self._settle(outcome, key, None)  # a failure is not shared beyond this batch
        twins = [(item, twin) for item in items for twin in outcome.twins.get(item.task_id, ())]
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
        # The dead letter is written before the task reads ``failed``: a crash in
        # between repeats the batch, never loses the request.
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
            )
        await self.stats.add({StatsField.TASKS_FAILED: len(items)})
        for item in items:
            log.error(
                "task failed to the DLQ",
                extra={"task_id": item.task_id, "batch_id": batch.batch_id, "error_class": error.error_class.value},
            )
