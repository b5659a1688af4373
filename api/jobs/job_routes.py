"""``/v1/batches`` in OpenAI's schema: create a batch job from an uploaded file, retrieve,
list and cancel it. ``api/jobs/job_driver.py`` drives each job; its lines run as low-priority
tasks of the tenant."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Request

from brimful.api.http.bodies import NO_RETRY, ApiError, parse_json, read_body
from brimful.api.http.guards import Principal, requires
from brimful.api.http.list_pages import page_answer, page_limit
from brimful.api.jobs.job_lines import ENDPOINTS
from brimful.api.state import ApiState, api_state
from brimful.core.api_keys import Scope
from brimful.core.batch_records import MAX_ACTIVE_JOBS, BatchRecord, new_batch_id
from brimful.core.batch_status import BatchStatus, parse_window
from brimful.core.file_records import UPLOAD_PURPOSES, expires_after_s

router = APIRouter(tags=["openai"])

BATCHES_PATH = "/v1/batches"
ALLOWED_FIELDS = ("input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after")
LONGEST_WINDOW_S = 24 * 3600
MAX_METADATA = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
BODY_LIMIT_BYTES = 64 * 1024
LIST_LIMIT_DEFAULT = 20
LIST_LIMIT_MAX = 100


def _invalid(message: str) -> ApiError:
    return ApiError(400, "invalid_request", message)


@router.post(BATCHES_PATH)
async def create_batch(request: Request, principal: Principal = Depends(requires(Scope.SUBMIT))) -> dict[str, Any]:
    """A batch job over an uploaded file (``purpose=batch``); it starts ``validating``."""
    state = api_state(request)
    document = parse_json(await read_body(request, BODY_LIMIT_BYTES, state.settings.api_read_timeout_s))
    if not isinstance(document, dict):
        raise _invalid('body must be a JSON object like {"input_file_id", "endpoint", "completion_window"}')
    unknown = sorted(set(document) - set(ALLOWED_FIELDS))
    if unknown:
        raise _invalid(f"unknown field(s): {', '.join(unknown)}; allowed: {', '.join(ALLOWED_FIELDS)}")
    endpoint = document.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise _invalid(f"endpoint must be one of: {', '.join(ENDPOINTS)}")
    window_text = document.get("completion_window")
    window_s = parse_window(window_text, LONGEST_WINDOW_S) if isinstance(window_text, str) else None
    if window_s is None:
        raise _invalid("completion_window must be 24h, or a shorter window such as 90s, 30m or 2h")
    metadata = _metadata(document.get("metadata"))
    output_expires_s = _output_expires_after(document.get("output_expires_after"))
    file_id = document.get("input_file_id")
    if not isinstance(file_id, str):
        raise _invalid("input_file_id is required: the id of a file uploaded with purpose batch")
    input_file = await state.file_records.get(file_id, principal.tenant)
    if input_file is None:
        raise ApiError(404, "file_not_found", f"no file {file_id[:64]!r} (unknown, deleted, or another tenant's)")
    if input_file.purpose not in UPLOAD_PURPOSES:
        raise _invalid(f"input file {file_id} has purpose {input_file.purpose}; a batch reads purpose batch")
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
    now = int(time.time())
    record = BatchRecord(
        batch_id=new_batch_id(),
        tenant=principal.tenant,
        endpoint=str(endpoint),
        input_file_id=file_id,
        completion_window=str(window_text),
        status=BatchStatus.VALIDATING,
        created_at=now,
        expires_at=now + window_s,
        metadata=metadata,
        output_expires_s=output_expires_s,
    )
    await state.batch_records.add(record)
    return record.as_openai()


def _output_expires_after(value: Any) -> int | None:
    """The seconds the job's output and error files are kept, from ``output_expires_after``."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"anchor", "seconds"}:
        raise ApiError(
            400,
            "invalid_request",
            'output_expires_after must be an object {"anchor": "created_at", "seconds": N}',
            param="output_expires_after",
        )
    try:
        return expires_after_s(value["anchor"], value["seconds"])
    except ValueError as error:
        raise ApiError(
            400, "invalid_request", f"output_expires_after: {error}", param="output_expires_after"
        ) from error


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA:
        raise _invalid(f"metadata must be an object of at most {MAX_METADATA} pairs")
    for key, text in value.items():
        if len(key) > MAX_METADATA_KEY or not isinstance(text, str) or len(text) > MAX_METADATA_VALUE:
            raise _invalid(
                f"metadata keys are at most {MAX_METADATA_KEY} characters and values strings of at most "
                f"{MAX_METADATA_VALUE}"
            )
    return value


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
