"""Accepting submitted tasks: the steps every task takes after its body was checked, in
the one order single and bulk submissions share (``Submitter``)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Sequence
from typing import Any

from aiokafka.errors import KafkaError, MessageSizeTooLargeError
from redis.exceptions import RedisError

from brimful.api.http.bodies import ApiError, admit, error_of
from brimful.api.http.guards import Principal
from brimful.api.state import ApiState
from brimful.api.tasks.group_commit import GroupCommitterFull, GroupCommitterStopped, InFlightLimitReached
from brimful.api.tasks.idempotency import commit_idempotency_key, release_idempotency_key
from brimful.api.tasks.submission import (
    RECORD_OVERHEAD_BYTES,
    Submission,
    broker_refused,
    check_callback,
    parse_submission,
    queued_answer,
    task_record,
    too_large_for_broker,
)
from brimful.core import metrics
from brimful.core.clock import now_ms
from brimful.core.model_catalogue import ModelCatalogue
from brimful.core.task_record import NewTask
from brimful.core.tenant_limits import TenantLimits

log = logging.getLogger("brimful.api")

# How long a request that reaches an API process still starting (model signature or broker
# not there yet) waits for it before a 503: with several API workers behind one port, one
# can be ready while the next is still starting. Longer than the 2 s the start-up retries
# back off to, so a model or broker that answers now is found within it.
STARTUP_WAIT_S = 3.0


def new_task_id() -> str:
    """A fresh task id: 128 random bits as 32 lowercase hex characters.
    ``uuid4().hex`` costs seven times as much (5.5 against 0.8 us) for what no reader uses."""
    return secrets.token_hex(16)


class Submitter:
    """One request's tasks, through their steps in this order:

    1. the service admits work: the models' metadata is loaded and the broker reached (503);
    2. the tenant's limits are read and its rate charged, a token a task, valid or not:
       checking an item is work too (429);
    3. each task is checked against the tenant's payload limit (413), and its callback URL,
       if it has one, against the addresses a webhook may reach (400);
    4. each is enqueued: its model's backlog (503), its record in Redis under the tenant's
       in-flight limit (429), then the broker, in a group commit (``group_commit``).
    """

    def __init__(self, state: ApiState, principal: Principal) -> None:
        self._state = state
        self._principal = principal

    async def submit(self, submission: Submission, task_id: str, key: str | None = None) -> None:
        """One task; a refusal raises. Its Idempotency-Key (``key``, claimed already) is
        bound once the task is accepted, and freed if it is not."""
        try:
            limits = await self._open(tasks=1)
            check_payload(submission, limits)
            if submission.callback_url:
                await check_callback(submission, self._state.webhook_hosts)
            await self._enqueue(submission, task_id, limits, key or "")
        except BaseException:  # whatever stopped it (a refusal, Redis, a cancelled request)
            if key is not None:
                await release_idempotency_key(self._state, key, task_id)
            raise
        if key is not None:
            await commit_idempotency_key(self._state, key, task_id)

    async def submit_many(self, items: list[Any]) -> list[dict[str, Any]]:
        """Many tasks, each answered on its own, in order: its id, or its error (an
        invalid item, or one past a limit, does not stop the others)."""
        limits = await self._open(tasks=len(items))
        catalogue = await served_catalogue(self._state)
        results: list[dict[str, Any]] = []
        valid: dict[int, tuple[str, Submission]] = {}
        for position, item in enumerate(items):
            try:
                submission = parse_submission(item, catalogue)
                check_payload(submission, limits)
                if submission.callback_url:
                    await check_callback(submission, self._state.webhook_hosts)
            except ApiError as error:
                results.append(error_of(error))
                continue
            valid[position] = (new_task_id(), submission)
            results.append({})

        refusals = await self._enqueue_each(list(valid.values()), limits)
        for (position, (task_id, submission)), refusal in zip(valid.items(), refusals):
            results[position] = queued_answer(task_id, submission.model) if refusal is None else error_of(refusal)
        return results

    async def submit_each(self, tasks: Sequence[tuple[str, Submission]]) -> list[ApiError | None]:
        """Tasks checked already, each with its id: steps 1 to 3 for them all (a refusal
        raises), then each enqueued on its own, answered in order (None: accepted)."""
        limits = await self._open(tasks=len(tasks))
        for _, submission in tasks:
            check_payload(submission, limits)
        return await self._enqueue_each(tasks, limits)

    async def _enqueue_each(
        self, tasks: Sequence[tuple[str, Submission]], limits: TenantLimits
    ) -> list[ApiError | None]:
        """Step 4 for each task side by side: its refusal, or None once enqueued."""

        async def one(task_id: str, submission: Submission) -> ApiError | None:
            try:
                await self._enqueue(submission, task_id, limits)
            except ApiError as error:
                return error
            return None

        return list(await asyncio.gather(*(one(task_id, submission) for task_id, submission in tasks)))

    async def _open(self, tasks: int) -> TenantLimits:
        """Steps 1 and 2; the tenant's limits."""
        await check_admission(self._state)
        limits = await self._state.tenant_limits.get(self._principal.tenant)
        await admit(self._state.rate_limiter, self._principal.tenant, tasks)
        return limits

    async def _enqueue(
        self, submission: Submission, task_id: str, limits: TenantLimits, idempotency_key: str = ""
    ) -> None:
        """Record the task as queued (429 if the tenant has too many in flight), then put it
        on the requests topic (acks=all): in a group commit with the submissions that arrive
        alongside (``group_commit``). 503 while the model's backlog is past its limit.
        ``idempotency_key``: the key it was submitted with, which then lives as long as it."""
        state, tenant = self._state, self._principal.tenant
        check_backlog(state, submission.model)
        submitted_at = now_ms()
        record = task_record(state, submission, task_id, tenant, submitted_at)
        limit = state.record_limit - RECORD_OVERHEAD_BYTES
        try:
            # Redis first, with the submissions that arrive alongside: a fast batcher must
            # never find the task missing.
            new_task = NewTask(task_id, submitted_at, tenant, limits.max_in_flight, submission.model, idempotency_key)
            if state.tracing is None:
                sent = await state.committers[submission.model].submit(new_task, record)
            else:
                with state.tracing.producer_span("brimful.enqueue", **{"brimful.task_id": task_id}) as headers:
                    sent = await state.committers[submission.model].submit(new_task, record, headers)
        except InFlightLimitReached as refused:
            raise ApiError(
                429,
                "too_many_in_flight",
                f"this tenant has {refused.count} unfinished tasks, its limit; retry once some finish",
                retry_after_s=1,
            ) from refused
        except GroupCommitterFull as error:
            raise ApiError(503, "overloaded", f"{error}; retry shortly", retry_after_s=1) from error
        except GroupCommitterStopped as error:  # still unwritten after the drain
            raise ApiError(503, "stopping", f"{error}; retry", retry_after_s=1) from error
        except RedisError as error:
            log.error("could not record task", extra={"task_id": task_id, "error": str(error)})
            raise ApiError(503, "store_unavailable", "the result store is unreachable", retry_after_s=1) from error
        except KafkaError as error:  # the task was taken back out of Redis
            log.error("could not enqueue task", extra={"task_id": task_id, "error": str(error)})
            if isinstance(error, MessageSizeTooLargeError):  # the broker's own limit is below the setting
                raise too_large_for_broker(len(record), limit) from error
            raise broker_refused() from error
        state.backlog.produced(sent.topic, sent.partition, sent.offset)
        metrics.TASKS_SUBMITTED.labels(submission.model).inc()


def check_payload(submission: Submission, limits: TenantLimits) -> None:
    """413 when the task's encoded inputs exceed the tenant's payload limit."""
    size = submission.payload_bytes
    if limits.max_payload_bytes and size > limits.max_payload_bytes:
        raise ApiError(
            413,
            "payload_too_large",
            f"the task's inputs take {size} bytes; this tenant's limit is {limits.max_payload_bytes} bytes per task",
        )


def model_not_ready() -> ApiError:
    """503: the models' metadata is not read from their servers yet."""
    return ApiError(503, "model_not_ready", "the models' metadata is not loaded yet", retry_after_s=1)


async def check_admission(state: ApiState) -> None:
    """503 while the models' metadata or the broker says no (after up to
    ``STARTUP_WAIT_S`` of waiting for them), or Redis is near its memory limit."""
    if not state.serving:
        await state.wait_until_serving(STARTUP_WAIT_S)
    if state.catalogue is None:
        raise model_not_ready()
    if not state.producer_started:
        raise ApiError(503, "broker_unavailable", "the broker is not reachable yet", retry_after_s=1)
    if state.redis_memory.full:
        raise ApiError(
            503, "store_full", "Redis is near its memory limit; the tasks accepted are finishing", retry_after_s=1
        )


async def served_catalogue(state: ApiState) -> ModelCatalogue:
    """The catalogue of the models served; before the API serves, waited for as
    ``check_admission`` waits (503 if it does not come)."""
    if state.catalogue is None:
        await check_admission(state)
    assert state.catalogue is not None  # check_admission answers 503 without it
    return state.catalogue


def check_backlog(state: ApiState, model: str) -> None:
    """503 while the model's own backlog is past ``max_backlog``: another model's backlog
    never refuses its tasks."""
    limit = state.settings.max_backlog
    topic = state.topics[model]
    backlog = state.backlog.backlog_of(topic)
    if backlog > limit:
        retry_after = state.backlog.retry_after_s(topic, limit)
        raise ApiError(
            503,
            "overloaded",
            f"{backlog} accepted tasks of model {model} are still unfinished (limit {limit}); "
            f"retry in about {retry_after} s",
            retry_after_s=retry_after,
        )
