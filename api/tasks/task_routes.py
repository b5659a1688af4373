"""``/v1/tasks``: submit (one or many), read (optionally waiting for the result), cancel."""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Depends, Request

from brimful.api.http.bodies import NO_RETRY, REPLAYED, ApiError, JsonAnswer, admit, parse_json, read_body
from brimful.api.http.guards import Principal, requires
from brimful.api.state import ApiState, api_state
from brimful.api.tasks.bulk_arrow import ARROW_STREAM, submit_arrow
from brimful.api.tasks.idempotency import checked_idempotency_key, claim_idempotency_key
from brimful.api.tasks.submission import Submission, parse_submission, queued_answer
from brimful.api.tasks.submitter import Submitter, new_task_id, served_catalogue
from brimful.api.tasks.task_waiters import read_own_task
from brimful.core import metrics
from brimful.core.api_keys import Scope
from brimful.core.number_text import finite_number
from brimful.core.task_record import TaskStatus, task_record_answer

router = APIRouter(tags=["tasks"])

TASKS_PATH = "/v1/tasks"
TASK_PATH_TEMPLATE = TASKS_PATH + "/{task_id}"
_TASK_PREFIX = TASKS_PATH + "/"

# Reads a request's whole body within (limit bytes, timeout s), or raises the ApiError to answer.
BodyReader = Callable[[int, float], Awaitable[bytes]]

BULK_BODY_FACTOR = 4  # a bulk body may be this many times a single task's
TASK_ID_PATTERN = re.compile(r"^[0-9a-f]{32}$")


def _query_value(query_string: bytes, name: str) -> str | None:
    """The last value of ``name`` in a raw query string, as Starlette's ``query_params``
    reads it, without building them all: a sixth of their cost on the routes every task
    takes (2 against 13 us for ``wait=30``)."""
    if not query_string:
        return None
    if b"%" in query_string or b"+" in query_string:  # escapes: the standard library decodes them
        return dict(parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)).get(name)
    wanted, found = name.encode("latin-1"), None
    for pair in query_string.split(b"&"):
        key, _, value = pair.partition(b"=")
        if key == wanted:
            found = value.decode("latin-1")
    return found


def hot_route(method: str, path: str) -> tuple[str, str] | None:
    """Which of the two routes every task takes this request is, as FastAPI's router
    matches them: (its template, the task_id or ""), or None. The direct lane
    (``api/http/direct_lane.py``) routes by it."""
    if method == "POST" and path == TASKS_PATH:
        return TASKS_PATH, ""
    if method == "GET" and path.startswith(_TASK_PREFIX):
        task_id = path[len(_TASK_PREFIX) :]
        if task_id and "/" not in task_id:  # FastAPI's {task_id}: one non-empty segment
            return TASK_PATH_TEMPLATE, task_id
    return None


def parse_wait(query_string: bytes, limit_s: float) -> float:
    """The ``wait`` query parameter: seconds to hold the answer for a result (0 = none)."""
    raw = _query_value(query_string, "wait")
    if raw is None or raw == "":
        return 0.0
    wait = finite_number(raw, 0.0, limit_s)
    if wait is None:
        raise ApiError(400, "invalid_request", f"wait must be a number of seconds from 0 to {limit_s:g}")
    return wait


def _default_model(state: ApiState) -> str:
    # Reading a task needs no model metadata: before it loads, the configured name.
    return state.catalogue.default if state.catalogue is not None else state.settings.model_name


def check_task_id(task_id: str) -> None:
    if not TASK_ID_PATTERN.match(task_id):
        raise ApiError(400, "malformed_task_id", f"task_id {task_id[:64]!r} is not 32 lowercase hex characters")


@router.post(TASKS_PATH, status_code=202)
async def submit_task(request: Request, principal: Principal = Depends(requires(Scope.SUBMIT))) -> JsonAnswer:
    """Accept one task; 202 with its task_id once durably queued. With ``?wait=S``, hold
    the answer up to S seconds and return the result inline (200) if it is ready."""
    state = api_state(request)
    body = partial(read_body, request)
    query = request.scope.get("query_string", b"")
    key = request.headers.get("idempotency-key")
    if state.tracing is not None:
        with state.tracing.server_span("brimful.accept", request.headers, **{"http.route": TASKS_PATH}):
            return await accept_task(state, principal, query, key, body)
    return await accept_task(state, principal, query, key, body)


async def accept_task(
    state: ApiState,
    principal: Principal,
    query_string: bytes,
    idempotency_key: str | None,
    body: BodyReader,
) -> JsonAnswer:
    """``POST /v1/tasks`` from what it reads of the request, whichever lane brought it:
    the raw query string, the Idempotency-Key header, and ``body``, called with the size
    and time it may take (``read_body`` in ``api/http/bodies.py``'s bounds and answers)."""
    settings = state.settings
    wait_s = parse_wait(query_string, settings.long_poll_max_s)
    document = parse_json(await body(settings.max_body_bytes, settings.api_read_timeout_s))
    submission = parse_submission(document, await served_catalogue(state))

    task_id = new_task_id()
    key = idempotency_key
    if key is not None:  # one tenant's keys never meet another's
        key = f"{principal.tenant}/{checked_idempotency_key(key)}"
        original = await claim_idempotency_key(state, key, task_id, submission)
        if original is not None:
            record = await state.store.get(original)
            answer = (
                task_record_answer(original, record, _default_model(state))
                if record
                else queued_answer(original, submission.model)
            )
            return JsonAnswer(answer, status_code=200, headers=REPLAYED)
    if wait_s > 0 and not state.waiters.has_room(principal.tenant):
        wait_s = 0.0  # the tenant holds its limit of waiters here: accept, answer 202 at once
        metrics.LONG_POLLS_DECLINED.inc()
    submitter = Submitter(state, principal)
    if wait_s <= 0:
        await submitter.submit(submission, task_id, key)
        return _queued(task_id, submission)
    # Watch before the task exists: its result cannot be published unseen, and no read of
    # the store is needed to start waiting.
    with state.waiters.holding(principal.tenant), state.waiters.watch(task_id) as finished:
        deadline = time.monotonic() + wait_s
        await submitter.submit(submission, task_id, key)
        record = await state.waiters.wait_final(task_id, principal.tenant, finished, deadline)
        if record is not None and not record.status.is_final and time.monotonic() < deadline:
            record = await state.waiters.read_when_final(
                task_id, principal.tenant, deadline - time.monotonic()
            )  # feed lost
        if record is not None and record.status.is_final:
            state.read_results.note(task_id)
            return JsonAnswer(task_record_answer(task_id, record, submission.model), status_code=200)
    return _queued(task_id, submission)


def _queued(task_id: str, submission: Submission) -> JsonAnswer:
    return JsonAnswer(queued_answer(task_id, submission.model), status_code=202)


@router.post(TASKS_PATH + ":batch")
async def submit_tasks(request: Request, principal: Principal = Depends(requires(Scope.SUBMIT))) -> dict[str, Any]:
    """Accept up to ``max_bulk_tasks`` tasks in one call. Answers their ids in order; an
    invalid item gets its own error and does not stop the others. As an Arrow IPC stream
    (``api/tasks/bulk_arrow.py``), a table with a column per input, a task a row."""
    state = api_state(request)
    settings = state.settings
    limit = settings.max_body_bytes * BULK_BODY_FACTOR
    body = await read_body(request, limit, settings.api_read_timeout_s)
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type == ARROW_STREAM:  # held to the same bytes once decompressed
        return await submit_arrow(state, principal, body, limit, request.query_params)
    document = parse_json(body)
    tasks = document.get("tasks") if isinstance(document, dict) else None
    if not isinstance(tasks, list) or not tasks:
        raise ApiError(
            422, "invalid_request", 'body must be {"tasks": [{"inputs": {...}}, ...]} with at least one task'
        )
    if len(tasks) > settings.max_bulk_tasks:
        raise ApiError(
            413, "too_many_tasks", f"{len(tasks)} tasks exceed the limit of {settings.max_bulk_tasks} per call"
        )
    results = await Submitter(state, principal).submit_many(tasks)
    return {"accepted": sum(1 for r in results if "task_id" in r), "results": results}


@router.get(TASK_PATH_TEMPLATE)
async def get_task(
    task_id: str, request: Request, principal: Principal = Depends(requires(Scope.READ))
) -> dict[str, Any]:
    """The task's status, with outputs once done or the error once failed. With
    ``?wait=S``, answer as soon as it is final, or after S seconds."""
    return await read_task(api_state(request), principal, task_id, request.scope.get("query_string", b""))


async def read_task(state: ApiState, principal: Principal, task_id: str, query_string: bytes) -> dict[str, Any]:
    """``GET /v1/tasks/{task_id}`` from its path parameter and raw query string, whichever
    lane brought it."""
    check_task_id(task_id)
    wait_s = parse_wait(query_string, state.settings.long_poll_max_s)
    await admit(state.read_limiter, principal.tenant)
    if wait_s > 0:
        record = await state.waiters.read_held(task_id, principal.tenant, wait_s)
    else:
        record = await read_own_task(state.store, task_id, principal.tenant)
    if record is None:
        raise ApiError(404, "task_not_found", f"no task {task_id} (unknown, or expired after the retention time)")
    if record.status.is_final:
        state.read_results.note(task_id)
    return task_record_answer(task_id, record, _default_model(state))


@router.delete(TASK_PATH_TEMPLATE)
async def cancel_task(
    task_id: str, request: Request, principal: Principal = Depends(requires(Scope.SUBMIT))
) -> dict[str, Any]:
    """Cancel a task that has not been sent to the model; 409 once it has."""
    check_task_id(task_id)
    state = api_state(request)
    await admit(state.read_limiter, principal.tenant)
    own = await read_own_task(state.store, task_id, principal.tenant)
    if own is None:
        raise ApiError(404, "task_not_found", f"no task {task_id} (unknown, or expired after the retention time)")
    model = own.model or _default_model(state)
    if await state.store.cancel(task_id, state.settings.model_scope(model)):
        return {"task_id": task_id, "model": model, "status": TaskStatus.CANCELLED.value}
    record = await state.store.get(task_id)
    raise ApiError(
        409,
        "not_cancellable",
        f"task {task_id} is already {record.status.value if record else 'gone'}",
        headers=NO_RETRY,
    )
