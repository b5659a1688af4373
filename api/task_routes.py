"""``/v1/tasks``: submit (one or many), read (optionally waiting for the result), cancel."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
import uuid
from typing import Any

from aiokafka.errors import KafkaError
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

from api.auth import Principal, requires
from api.errors import ApiError
from api.state import ApiState, api_state, read_body
from api.submission import Submission, parse_json, parse_submission
from brimful import metrics
from brimful.api_keys import Scope
from brimful.task_status import TaskStatus
from brimful.task_store import TaskRecord, now_ms
from brimful.tenant_limits import TenantLimits
from schemas import TaskRequest

log = logging.getLogger("brimful.api")
router = APIRouter(tags=["tasks"])

TASK_ID_PATTERN = re.compile(r"^[0-9a-f]{32}$")
IDEMPOTENCY_KEY_PATTERN = re.compile(r"^[\x21-\x7e]{1,255}$")


def parse_wait(request: Request, limit_s: float) -> float:
    """The ``wait`` query parameter: seconds to hold the answer for a result (0 = none)."""
    raw = request.query_params.get("wait")
    if raw is None or raw == "":
        return 0.0
    try:
        wait = float(raw)
    except ValueError as error:
        raise ApiError(400, "invalid_request", f"wait must be a number of seconds, got {raw[:32]!r}") from error
    if not math.isfinite(wait) or not 0 <= wait <= limit_s:
        raise ApiError(400, "invalid_request", f"wait must be between 0 and {limit_s:g} seconds")
    return wait


def check_task_id(task_id: str) -> None:
    if not TASK_ID_PATTERN.match(task_id):
        raise ApiError(400, "malformed_task_id", f"task_id {task_id[:64]!r} is not 32 lowercase hex characters")


def task_answer(task_id: str, record: TaskRecord) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "task_id": task_id,
        "status": record.status.value,
        "submitted_at_ms": record.submitted_at_ms,
        "updated_at_ms": record.updated_at_ms,
    }
    if record.status is TaskStatus.DONE:
        answer["outputs"] = record.outputs
    if record.status is TaskStatus.FAILED:
        answer["error"] = record.error
    return answer


async def read_own_task(state: ApiState, task_id: str, principal: Principal) -> TaskRecord | None:
    """The task's record if it belongs to the caller's tenant; another tenant's task
    reads as unknown (404), so ids cannot be probed."""
    record = await state.store.get(task_id)
    return record if record is not None and record.tenant == principal.tenant else None


async def read_when_final(state: ApiState, task_id: str, principal: Principal, wait_s: float) -> TaskRecord | None:
    """The caller's task, held up to ``wait_s`` until it is final; woken by the push."""
    deadline = time.monotonic() + wait_s
    while True:
        async with state.waiters.watch(task_id) as finished:
            record = await read_own_task(state, task_id, principal)  # after registering: nothing slips by
            if record is None or record.status.is_final or time.monotonic() >= deadline:
                return record
            record = await wait_final(state, task_id, principal, finished, deadline)
            if record is None or record.status.is_final or time.monotonic() >= deadline:
                return record


async def wait_final(
    state: ApiState, task_id: str, principal: Principal, finished: asyncio.Future[TaskRecord | None], deadline: float
) -> TaskRecord | None:
    """Wait on a registered watch until the deadline. The push carries the final record,
    so no read is needed; on a timeout or a lost feed, the store says where the task is."""
    try:
        record = await asyncio.wait_for(finished, timeout=max(0.0, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        record = None
    if record is None:
        return await read_own_task(state, task_id, principal)
    return record if record.tenant == principal.tenant else None


async def take_tokens(state: ApiState, principal: Principal, count: int) -> None:
    """429 with Retry-After when the tenant is over its rate."""
    verdict = await state.rate_limiter.take(principal.tenant, count)
    if not verdict.allowed:
        raise ApiError(
            429,
            "rate_limited",
            f"over the rate of {state.rate_limiter.rate_per_s:g} tasks/s (burst {state.rate_limiter.burst}); "
            f"retry in {verdict.retry_after_s} s",
            {"Retry-After": str(verdict.retry_after_s)},
        )


def check_payload(submission: Submission, limits: TenantLimits) -> None:
    """413 when the task's encoded inputs exceed the tenant's payload limit."""
    size = submission.payload_bytes
    if limits.max_payload_bytes and size > limits.max_payload_bytes:
        raise ApiError(
            413,
            "payload_too_large",
            f"the task's inputs take {size} bytes; this tenant's limit is {limits.max_payload_bytes} bytes per task",
        )


def check_admission(state: ApiState) -> None:
    """503 while the model's metadata, the broker or the backlog says no."""
    if state.signature is None:
        raise ApiError(503, "model_not_ready", "the model's metadata is not loaded yet", {"Retry-After": "1"})
    if not state.producer_started:
        raise ApiError(503, "broker_unavailable", "the broker is not reachable yet", {"Retry-After": "1"})
    limit = state.settings.max_backlog
    backlog = state.backlog.backlog
    if backlog > limit:
        retry_after = state.backlog.retry_after_s(limit)
        raise ApiError(
            503,
            "overloaded",
            f"{backlog} accepted tasks are still unfinished (limit {limit}); retry in about {retry_after} s",
            {"Retry-After": str(retry_after)},
        )


async def enqueue(state: ApiState, submission: Submission, task_id: str, tenant: str, max_in_flight: int) -> None:
    """Record the task as queued (429 if the tenant has too many in flight), then put it
    on the requests topic (acks=all)."""
    assert state.signature is not None
    submitted_at = now_ms()
    message = TaskRequest(
        task_id=task_id,
        model=state.signature.name,
        submitted_at_ms=submitted_at,
        deadline_at_ms=submitted_at + submission.deadline_ms if submission.deadline_ms else 0,
        tenant=tenant,
    )
    for name, tensor in submission.inputs.items():
        message.inputs[name].CopyFrom(tensor)
    try:
        # Redis first: a fast batcher must never find the task missing.
        in_flight = await state.store.create_queued(task_id, submitted_at, tenant, max_in_flight)
    except RedisError as error:
        log.error("could not record task", extra={"task_id": task_id, "error": str(error)})
        raise ApiError(503, "store_unavailable", "the result store is unreachable", {"Retry-After": "1"}) from error
    if in_flight is not None:
        raise ApiError(
            429,
            "too_many_in_flight",
            f"this tenant has {in_flight} unfinished tasks, its limit; retry once some finish",
            {"Retry-After": "1"},
        )
    try:
        sent = await state.producer.send_and_wait(
            state.settings.requests_topic, value=message.SerializeToString(), key=task_id.encode()
        )
    except KafkaError as error:
        log.error("could not enqueue task", extra={"task_id": task_id, "error": str(error)})
        await state.store.forget(task_id, tenant)
        raise ApiError(503, "broker_unavailable", "the broker did not accept the task", {"Retry-After": "1"}) from error
    state.backlog.produced(sent.partition, sent.offset)
    metrics.TASKS_SUBMITTED.inc()


@router.post("/v1/tasks", status_code=202)
async def submit_task(request: Request, principal: Principal = Depends(requires(Scope.SUBMIT))) -> JSONResponse:
    """Accept one task; 202 with its task_id once durably queued. With ``?wait=S``, hold
    the answer up to S seconds and return the result inline (200) if it is ready."""
    state = api_state(request)
    settings = state.settings
    wait_s = parse_wait(request, settings.long_poll_max_s)
    document = parse_json(await read_body(request, settings.max_body_bytes))
    if state.signature is None:
        check_admission(state)
    submission = parse_submission(document, state.signature)  # type: ignore[arg-type]

    task_id = uuid.uuid4().hex
    key = request.headers.get("idempotency-key")
    if key is not None:
        if not IDEMPOTENCY_KEY_PATTERN.match(key):
            raise ApiError(400, "invalid_idempotency_key", "Idempotency-Key must be 1-255 visible ASCII characters")
        key = f"{principal.tenant}/{key}"  # one tenant's keys never meet another's
        original = await state.store.claim_idempotency_key(key, task_id)
        if original is not None:
            record = await state.store.get(original)
            answer = task_answer(original, record) if record else {"task_id": original, "status": TaskStatus.QUEUED.value}
            return JSONResponse(answer, status_code=200, headers={"Idempotent-Replayed": "true"})
    async with contextlib.AsyncExitStack() as waiting:
        # Watch before the task exists: its result cannot be published unseen, and no
        # read of the store is needed to start waiting.
        finished = await waiting.enter_async_context(state.waiters.watch(task_id)) if wait_s > 0 else None
        deadline = time.monotonic() + wait_s
        try:
            check_admission(state)
            limits = await state.tenant_limits.get(principal.tenant)
            check_payload(submission, limits)
            await take_tokens(state, principal, 1)
            await enqueue(state, submission, task_id, principal.tenant, limits.max_in_flight)
        except ApiError:
            await state.store.release_idempotency_key(key, task_id)
            raise
        if finished is not None:
            record = await wait_final(state, task_id, principal, finished, deadline)
            if record is not None and not record.status.is_final and time.monotonic() < deadline:
                record = await read_when_final(state, task_id, principal, deadline - time.monotonic())  # feed lost
            if record is not None and record.status.is_final:
                return JSONResponse(task_answer(task_id, record), status_code=200)
    return JSONResponse({"task_id": task_id, "status": TaskStatus.QUEUED.value}, status_code=202)


@router.post("/v1/tasks:batch")
async def submit_tasks(request: Request, principal: Principal = Depends(requires(Scope.SUBMIT))) -> dict[str, Any]:
    """Accept up to ``max_bulk_tasks`` tasks in one call. Answers their ids in order; an
    invalid item gets its own error and does not stop the others."""
    state = api_state(request)
    settings = state.settings
    document = parse_json(await read_body(request, settings.max_body_bytes * 4))
    tasks = document.get("tasks") if isinstance(document, dict) else None
    if not isinstance(tasks, list) or not tasks:
        raise ApiError(422, "invalid_request", 'body must be {"tasks": [{"inputs": {...}}, ...]} with at least one task')
    if len(tasks) > settings.max_bulk_tasks:
        raise ApiError(413, "too_many_tasks", f"{len(tasks)} tasks exceed the limit of {settings.max_bulk_tasks} per call")
    check_admission(state)
    limits = await state.tenant_limits.get(principal.tenant)

    # Every item is checked first; only the valid ones take tokens. Each is then admitted
    # on its own: past the tenant's in-flight limit, an item gets its own 429 error.
    results: list[dict[str, Any]] = []
    valid: dict[int, tuple[str, Submission]] = {}
    for position, item in enumerate(tasks):
        try:
            submission = parse_submission(item, state.signature)  # type: ignore[arg-type]
            check_payload(submission, limits)
        except ApiError as error:
            results.append({"error": {"code": error.code, "message": error.message}})
            continue
        valid[position] = (uuid.uuid4().hex, submission)
        results.append({})
    if valid:
        await take_tokens(state, principal, len(valid))

    async def one(task_id: str, submission: Submission) -> dict[str, Any]:
        try:
            await enqueue(state, submission, task_id, principal.tenant, limits.max_in_flight)
        except ApiError as error:
            return {"error": {"code": error.code, "message": error.message}}
        return {"task_id": task_id, "status": TaskStatus.QUEUED.value}

    answers = await asyncio.gather(*(one(task_id, submission) for task_id, submission in valid.values()))
    for position, answer in zip(valid, answers):
        results[position] = answer
    return {"accepted": sum(1 for r in results if "task_id" in r), "results": results}


@router.get("/v1/tasks/{task_id}")
async def get_task(
    task_id: str, request: Request, principal: Principal = Depends(requires(Scope.READ))
) -> dict[str, Any]:
    """The task's status, with outputs once done or the error once failed. With
    ``?wait=S``, answer as soon as it is final, or after S seconds."""
    check_task_id(task_id)
    state = api_state(request)
    wait_s = parse_wait(request, state.settings.long_poll_max_s)
    record = await read_when_final(state, task_id, principal, wait_s)
    if record is None:
        raise ApiError(404, "task_not_found", f"no task {task_id} (unknown, or expired after the retention time)")
    return task_answer(task_id, record)


@router.delete("/v1/tasks/{task_id}")
async def cancel_task(
    task_id: str, request: Request, principal: Principal = Depends(requires(Scope.SUBMIT))
) -> dict[str, Any]:
    """Cancel a task that has not been sent to the model; 409 once it has."""
    check_task_id(task_id)
    state = api_state(request)
    if await read_own_task(state, task_id, principal) is None:
        raise ApiError(404, "task_not_found", f"no task {task_id} (unknown, or expired after the retention time)")
    if await state.store.cancel(task_id):
        return {"task_id": task_id, "status": TaskStatus.CANCELLED.value}
    record = await state.store.get(task_id)
    raise ApiError(409, "not_cancellable", f"task {task_id} is already {record.status.value if record else 'gone'}")
