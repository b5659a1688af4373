"""``/v1/batches`` in OpenAI's schema: create a batch job from an uploaded file, retrieve,
list and cancel it. ``api/jobs/job_driver.py`` drives each job; its lines run as low-priority
tasks of the tenant."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from brimful.api.http.bodies import NO_RETRY, REPLAYED, ApiError, JsonAnswer, parse_json, read_body
from brimful.api.http.body_schema import BodySchema
from brimful.api.http.guards import Principal, requires
from brimful.api.http.list_pages import page_answer, page_limit
from brimful.api.jobs.job_lines import ENDPOINTS
from brimful.api.jobs.job_results import part_name
from brimful.api.jobs.job_retry import failed_ids, retry_input
from brimful.api.openai.create_once import CreateClaim, created_once, request_key
from brimful.api.state import ApiState, api_state
from brimful.core.api_keys import Scope
from brimful.core.batch_records import INVALID_LINES, MAX_ACTIVE_JOBS, BatchRecord, new_batch_id
from brimful.core.batch_status import BatchStatus, parse_window
from brimful.core.file_records import EXPIRES_AFTER_MAX_S, EXPIRES_AFTER_MIN_S, EXPIRY_ANCHOR, UPLOAD_PURPOSES
from brimful.core.object_store import ObjectNotFound

router = APIRouter(tags=["openai"])

BATCHES_PATH = "/v1/batches"
LONGEST_WINDOW_S = 24 * 3600
MAX_METADATA = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
BODY_LIMIT_BYTES = 64 * 1024
EXPIRES_AFTER: dict[str, Any] = {
    "type": "object",
    "required": ["anchor", "seconds"],
    "additionalProperties": False,
    "properties": {
        "anchor": {"type": "string", "enum": [EXPIRY_ANCHOR]},
        "seconds": {
            "type": "integer",
            "minimum": EXPIRES_AFTER_MIN_S,
            "maximum": EXPIRES_AFTER_MAX_S,
            "description": "seconds after its creation the file is removed",
        },
    },
}
BATCH_BODY = BodySchema(
    {
        "type": "object",
        "required": ["input_file_id", "endpoint", "completion_window"],
        "additionalProperties": False,
        "properties": {
            "input_file_id": {"type": "string", "description": "the id of a file uploaded with purpose batch"},
            "endpoint": {"type": "string", "enum": list(ENDPOINTS)},
            "completion_window": {
                "type": "string",
                "pattern": "^[0-9]{1,7}[smh]$",
                "description": "24h as OpenAI's, or shorter: 90s, 30m, 2h",
            },
            "metadata": {
                "type": ["object", "null"],
                "maxProperties": MAX_METADATA,
                "propertyNames": {"maxLength": MAX_METADATA_KEY},
                "additionalProperties": {"type": "string", "maxLength": MAX_METADATA_VALUE},
            },
            "invalid_lines": {
                "type": "string",
                "enum": list(INVALID_LINES),
                "default": INVALID_LINES[0],
                "description": "Brimful's. fail (OpenAI's way): an input with an invalid line fails at validating, "
                "errors naming the lines; error_file: the valid lines run, each invalid one answered in the error file",
            },
            "output_expires_after": {
                **EXPIRES_AFTER,
                "type": ["object", "null"],
                "description": "how long the job's output and error files are kept, from their creation",
            },
        },
    }
)
LIST_LIMIT_DEFAULT = 20
LIST_LIMIT_MAX = 100


@router.post(BATCHES_PATH)
async def create_batch(request: Request, principal: Principal = Depends(requires(Scope.SUBMIT))) -> JsonAnswer:
    """A batch job over an uploaded file (``purpose=batch``); it starts ``validating``.
    With an Idempotency-Key, a retry is answered the job its first try made."""
    state = api_state(request)
    document = BATCH_BODY.check(
        parse_json(await read_body(request, BODY_LIMIT_BYTES, state.settings.api_read_timeout_s))
    )
    window_s = parse_window(document["completion_window"], LONGEST_WINDOW_S)
    if window_s is None:
        raise ApiError(
            400, "invalid_request", "completion_window must be 24h, or a shorter window such as 90s, 30m or 2h",
            param="completion_window",
        )  # fmt: skip

    async with _new_job(state, principal, "batches", request) as claim:
        if claim.earlier is not None:
            return await _replayed(state, claim.earlier, principal)
        await _input_file(state, document["input_file_id"], principal)
        await _admit_job(state, principal)
        now = int(time.time())
        expires = document.get("output_expires_after")
        record = BatchRecord(
            batch_id=claim.new_id,
            tenant=principal.tenant,
            endpoint=document["endpoint"],
            input_file_id=document["input_file_id"],
            completion_window=document["completion_window"],
            status=BatchStatus.VALIDATING,
            created_at=now,
            expires_at=now + window_s,
            metadata=document.get("metadata"),
            output_expires_s=int(expires["seconds"]) if expires else None,
            invalid_lines=document.get("invalid_lines", INVALID_LINES[0]),
        )
        await state.batch_records.add(record)
    return JsonAnswer(record.as_openai())


@asynccontextmanager
async def _new_job(state: ApiState, principal: Principal, kind: str, request: Request) -> AsyncIterator[CreateClaim]:
    """A new job's id, claimed under the request's Idempotency-Key (``created_once``)."""

    async def exists(batch_id: str) -> bool:
        return await state.batch_records.get(batch_id, principal.tenant) is not None

    async with created_once(state, principal.tenant, kind, request_key(request), new_batch_id(), exists) as claim:
        yield claim


async def _replayed(state: ApiState, batch_id: str, principal: Principal) -> JsonAnswer:
    """The job a request's first try made, answered again."""
    return JsonAnswer((await _own_batch(state, batch_id, principal)).as_openai(), headers=REPLAYED)


async def _input_file(state: ApiState, file_id: str, principal: Principal) -> None:
    """404 unless ``file_id`` is the tenant's; 400 unless a batch may read it."""
    input_file = await state.file_records.get(file_id, principal.tenant)
    if input_file is None:
        raise ApiError(404, "file_not_found", f"no file {file_id[:64]!r} (unknown, deleted, or another tenant's)")
    if input_file.purpose not in UPLOAD_PURPOSES:
        raise ApiError(
            400, "invalid_request", f"input file {file_id} has purpose {input_file.purpose}; a batch reads purpose batch",
            param="input_file_id",
        )  # fmt: skip


async def _admit_job(state: ApiState, principal: Principal) -> None:
    """429 while the deployment or the tenant runs as many jobs as it may."""
    active = await state.batch_records.active(MAX_ACTIVE_JOBS)
    if len(active) >= MAX_ACTIVE_JOBS:
        raise ApiError(
            429, "too_many_batches", f"{MAX_ACTIVE_JOBS} batch jobs are running; retry later", retry_after_s=60
        )
    most = state.settings.batch_max_active_per_tenant
    tenants = await state.batch_records.tenants(active)
    if sum(1 for tenant in tenants.values() if tenant == principal.tenant) >= most:
        raise ApiError(
            429, "too_many_batches", f"this tenant has {most} batch jobs not yet ended; retry later",
            retry_after_s=60,
        )  # fmt: skip


async def _own_batch(state: ApiState, batch_id: str, principal: Principal) -> BatchRecord:
    record = await state.batch_records.get(batch_id, principal.tenant)
    if record is None:
        raise ApiError(404, "batch_not_found", f"no batch {batch_id[:64]!r} (unknown, or another tenant's)")
    return record


@router.get(BATCHES_PATH)
async def list_batches(request: Request, principal: Principal = Depends(requires(Scope.READ))) -> dict[str, Any]:
    """The tenant's batch jobs, newest first, a page at a time (``limit``, ``after``)."""
    limit = page_limit(request.query_params.get("limit"), LIST_LIMIT_MAX, LIST_LIMIT_DEFAULT)
    records, more = await api_state(request).batch_records.page(
        principal.tenant, limit, request.query_params.get("after")
    )
    return page_answer([record.as_openai() for record in records], more)


@router.get(BATCHES_PATH + "/{batch_id}")
async def retrieve_batch(
    batch_id: str, request: Request, principal: Principal = Depends(requires(Scope.READ))
) -> dict[str, Any]:
    """One of the tenant's batch jobs."""
    return (await _own_batch(api_state(request), batch_id, principal)).as_openai()


@router.post(BATCHES_PATH + "/{batch_id}/cancel")
async def cancel_batch(
    batch_id: str, request: Request, principal: Principal = Depends(requires(Scope.SUBMIT))
) -> dict[str, Any]:
    """Cancel a job not yet ended: it moves to ``cancelling``, what was not dispatched is
    cancelled, and it ends ``cancelled`` with what finished in its output file. 409 once
    it is finalizing or ended."""
    state = api_state(request)
    record = await _own_batch(state, batch_id, principal)
    if record.status is not BatchStatus.CANCELLING:
        left = await state.batch_records.move(
            batch_id, BatchStatus.CANCELLING, (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)
        )
        if left is None:
            current = await _own_batch(state, batch_id, principal)
            raise ApiError(
                409, "not_cancellable", f"batch {batch_id} is already {current.status.value}", headers=NO_RETRY
            )
    return (await _own_batch(state, batch_id, principal)).as_openai()


@router.post(BATCHES_PATH + "/{batch_id}/retry")
async def retry_batch(
    batch_id: str, request: Request, principal: Principal = Depends(requires(Scope.SUBMIT))
) -> JsonAnswer:
    """Brimful's: run a job's failed lines again, as a new job (its ``retry_of`` names this
    one) with the same endpoint, window, metadata and handling of invalid lines; 409 while
    the job runs, when nothing failed, or when its input or error file is gone. With an
    Idempotency-Key, a retry of this call is answered the job its first try made."""
    state = api_state(request)
    record = await _own_batch(state, batch_id, principal)
    if not record.status.is_final:
        raise ApiError(
            409, "not_ended", f"batch {batch_id} is {record.status.value}: retry it once it ends", headers=NO_RETRY
        )

    async with _new_job(state, principal, "retries", request) as claim:
        if claim.earlier is not None:
            return await _replayed(state, claim.earlier, principal)
        failed = await failed_ids(state, record)
        await _admit_job(state, principal)
        async with state.upload_gate.opened(principal.tenant) as room:
            retry_file = await retry_input(state, record, failed, room)
        now = int(time.time())
        again = BatchRecord(
            batch_id=claim.new_id,
            tenant=record.tenant,
            endpoint=record.endpoint,
            input_file_id=retry_file.file_id,
            completion_window=record.completion_window,
            status=BatchStatus.VALIDATING,
            created_at=now,
            expires_at=now + (record.expires_at - record.created_at),
            metadata=record.metadata,
            output_expires_s=record.output_expires_s,
            invalid_lines=record.invalid_lines,
            retry_of=record.batch_id,
        )
        await state.batch_records.add(again)
    return JsonAnswer(again.as_openai())


RESULT_KINDS = ("output", "errors")


@router.get(BATCHES_PATH + "/{batch_id}/results")
async def batch_results(
    batch_id: str, request: Request, principal: Principal = Depends(requires(Scope.READ))
) -> StreamingResponse:
    """Brimful's: the job's output lines written so far (``?file=errors``: its error lines),
    while it runs or after it ended, as JSONL in the order they were written. Lines are
    written a step at a time (every few seconds); a read that meets the job's end may stop
    at a part joined meanwhile: read again (each line names its ``custom_id``)."""
    state = api_state(request)
    kind = request.query_params.get("file", "output")
    if kind not in RESULT_KINDS:
        raise ApiError(400, "invalid_request", "file must be output or errors", param="file")
    record = await _own_batch(state, batch_id, principal)
    joined = record.output_file_id if kind == "output" else record.error_file_id
    parts = record.output_parts if kind == "output" else record.error_parts
    names = [joined] if joined else [part_name(batch_id, kind, number) for number in range(parts)]

    async def lines() -> AsyncIterator[bytes]:
        for name in names:
            try:
                async for chunk in state.object_store.chunks(name):
                    yield chunk
            except ObjectNotFound:  # joined and removed at the job's end, after the record was read
                return

    return StreamingResponse(lines(), media_type="application/jsonl")
