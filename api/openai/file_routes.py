"""``/v1/files`` in OpenAI's schema: upload (``purpose=batch``), retrieve, list, download
and delete a tenant's files. The bytes go to the object store as they arrive
(``api/openai/upload.py``); a file's record is written once they are all there."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from brimful.api.http.bodies import REPLAYED, ApiError, JsonAnswer
from brimful.api.http.guards import Principal, requires
from brimful.api.http.list_pages import page_answer, page_limit
from brimful.api.jobs.result_tables import FORMATS, table_chunks
from brimful.api.openai.create_once import created_once, request_key
from brimful.api.openai.file_names import attachment
from brimful.api.openai.upload import receive_upload
from brimful.api.state import ApiState, api_state
from brimful.core.api_keys import Scope
from brimful.core.file_records import OUTPUT_PURPOSE, UPLOAD_PURPOSES, FileRecord, expires_after_s, new_file_id
from brimful.core.object_store import ObjectNotFound

log = logging.getLogger("brimful.api")

router = APIRouter(tags=["openai"])

FILES_PATH = "/v1/files"
EXPIRES_AFTER_FIELDS = ("expires_after[anchor]", "expires_after[seconds]")  # as OpenAI's SDK sends them
UPLOAD_FIELDS = ("purpose", *EXPIRES_AFTER_FIELDS)
LIST_LIMIT_DEFAULT = 100
LIST_LIMIT_MAX = 10_000  # OpenAI's own bound on a page of files


@router.post(FILES_PATH)
async def upload_file(request: Request, principal: Principal = Depends(requires(Scope.SUBMIT))) -> JsonAnswer:
    """Upload a file (``multipart/form-data``: ``file``, ``purpose`` and optionally
    ``expires_after[anchor]`` with ``expires_after[seconds]``); OpenAI's File object. With
    an Idempotency-Key, a retry is answered the file its first try made (its own bytes,
    read in full, are dropped)."""
    state = api_state(request)
    settings = state.settings
    key = request_key(request)  # a bad one refused before the upload
    file_id = new_file_id()
    async with state.upload_gate.opened(principal.tenant) as room:
        upload = await receive_upload(
            request, state.object_store, file_id, room, settings.api_read_timeout_s, settings.file_upload_max_s
        )
    unknown = sorted(set(upload.fields) - set(UPLOAD_FIELDS))
    purpose = upload.fields.get("purpose")
    refusal = (
        f"unknown field(s): {', '.join(unknown)}; allowed: file, {', '.join(UPLOAD_FIELDS)}"
        if unknown
        else None
        if purpose in UPLOAD_PURPOSES
        else f"purpose must be one of: {', '.join(UPLOAD_PURPOSES)}"
    )
    param = None
    expires_s = None
    if refusal is None:
        try:
            expires_s = _expires_after(upload.fields)
        except ValueError as error:
            refusal, param = f"expires_after: {error}", "expires_after"
    if refusal is not None:
        await state.object_store.delete(file_id)
        raise ApiError(400, "invalid_request", refusal, param=param)
    now = int(time.time())
    expires_at = now + expires_s if expires_s is not None else None
    record = FileRecord(file_id, principal.tenant, upload.filename, upload.bytes, str(purpose), now, expires_at)

    async def exists(earlier_id: str) -> bool:
        return await state.file_records.get(earlier_id, principal.tenant) is not None

    try:
        async with created_once(state, principal.tenant, "files", key, file_id, exists) as claim:
            if claim.earlier is not None:
                await state.object_store.delete(file_id)
                return JsonAnswer((await _own_file(state, claim.earlier, principal)).as_openai(), headers=REPLAYED)
            await state.file_records.add(record)
    except BaseException:
        await state.object_store.delete(file_id)
        raise
    log.info("file uploaded", extra={"file_id": file_id, "bytes": upload.bytes})
    return JsonAnswer(record.as_openai())


def _expires_after(fields: dict[str, str]) -> int | None:
    """The seconds of the upload's ``expires_after``, if it has one; ValueError naming what
    is wrong (one part without the other, a bad anchor or number)."""
    anchor, seconds = (fields.get(name) for name in EXPIRES_AFTER_FIELDS)
    if anchor is None and seconds is None:
        return None
    if anchor is None or seconds is None:
        raise ValueError("give both anchor and seconds")
    return expires_after_s(anchor, seconds)


async def _own_file(state: ApiState, file_id: str, principal: Principal) -> FileRecord:
    record = await state.file_records.get(file_id, principal.tenant)
    if record is None:
        raise ApiError(404, "file_not_found", f"no file {file_id[:64]!r} (unknown, deleted, or another tenant's)")
    return record


@router.get(FILES_PATH)
async def list_files(request: Request, principal: Principal = Depends(requires(Scope.READ))) -> dict[str, Any]:
    """The tenant's files, newest first (``order=asc``: oldest), a page at a time (``limit``,
    ``after``), of one ``purpose`` if given."""
    query = request.query_params
    limit = page_limit(query.get("limit"), LIST_LIMIT_MAX, LIST_LIMIT_DEFAULT)
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, "invalid_request", "order must be asc or desc")
    purpose = query.get("purpose")
    if purpose is not None and purpose not in (*UPLOAD_PURPOSES, OUTPUT_PURPOSE):
        raise ApiError(
            400, "invalid_request", f"purpose must be one of: {', '.join((*UPLOAD_PURPOSES, OUTPUT_PURPOSE))}"
        )
    records, more = await api_state(request).file_records.page(
        principal.tenant, limit, query.get("after"), purpose, newest_first=order == "desc"
    )
    return page_answer([record.as_openai() for record in records], more)


@router.get(FILES_PATH + "/{file_id}")
async def retrieve_file(
    file_id: str, request: Request, principal: Principal = Depends(requires(Scope.READ))
) -> dict[str, Any]:
    """One of the tenant's files."""
    return (await _own_file(api_state(request), file_id, principal)).as_openai()


@router.get(FILES_PATH + "/{file_id}/content")
async def file_content(
    file_id: str, request: Request, principal: Principal = Depends(requires(Scope.READ))
) -> StreamingResponse:
    """The file's bytes, streamed from the store a chunk at a time; a batch job's output or
    error file also as a table (``?format=parquet`` or ``arrow``: ``api/jobs/result_tables.py``)."""
    state = api_state(request)
    record = await _own_file(state, file_id, principal)
    table_format = request.query_params.get("format")
    if table_format is not None:
        if table_format not in FORMATS:
            raise ApiError(400, "invalid_request", f"format must be one of: {', '.join(FORMATS)}")
        if record.purpose != OUTPUT_PURPOSE:
            raise ApiError(400, "invalid_request", f"format applies to a batch job's results ({OUTPUT_PURPOSE} files)")
        name = f"{record.filename.rsplit('.', 1)[0]}.{table_format}"
        return StreamingResponse(
            table_chunks(state.object_store, file_id, table_format),
            media_type=FORMATS[table_format],
            headers={"content-disposition": attachment(name)},
        )
    chunks = state.object_store.chunks(file_id)
    try:
        first = await anext(chunks, b"")
    except ObjectNotFound as error:
        raise ApiError(404, "file_not_found", f"file {file_id}'s content is gone from the store") from error

    async def body() -> AsyncIterator[bytes]:
        yield first
        async for chunk in chunks:
            yield chunk

    return StreamingResponse(
        body(),
        media_type="application/octet-stream",
        headers={
            "content-length": str(record.size),
            "content-disposition": attachment(record.filename),
        },
    )


@router.delete(FILES_PATH + "/{file_id}")
async def delete_file(
    file_id: str, request: Request, principal: Principal = Depends(requires(Scope.SUBMIT))
) -> dict[str, Any]:
    """Delete one of the tenant's files: its record, then its bytes."""
    state = api_state(request)
    record = await _own_file(state, file_id, principal)
    await state.file_records.remove(record)
    await state.object_store.delete(file_id)
    return {"id": file_id, "object": "file", "deleted": True}
