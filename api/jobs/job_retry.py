"""The input of a job's retry (``POST /v1/batches/{id}/retry``, Brimful's): the lines of a
job that ended whose answer is in its error file, read again from its input file.

A line counts as failed when its error file names its ``custom_id``: it failed at the
model, expired, was cancelled or never ran (the job cancelled, expired, or its input
cut short), or was refused as it was read. Lines whose error has no ``custom_id`` (not
JSON) cannot be named, so they are not retried. The failed lines are copied from the input
file, in its order, each once, into a new file of the tenant's (``purpose`` batch), which
the new job reads; the first job's files are left as they are.

Bounds: the error file and the input are read a line at a time (a line at most
``MAX_LINE_BYTES``); the failed ids are kept as 16-byte digests, so 50,000 of them take
about 4 MB however long the ids; the new file counts against the tenant's stored bytes and
goes through its upload gate (its rate, its uploads at once, its quota: 413 past it).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator

from brimful.api.http.bodies import NO_RETRY, ApiError
from brimful.api.jobs.job_lines import MAX_LINE_BYTES, custom_id_of, non_blank
from brimful.api.state import ApiState
from brimful.core.batch_records import BatchRecord
from brimful.core.file_records import FileRecord, new_file_id
from brimful.core.object_store import LineTooLong, ObjectNotFound

YIELD_EVERY_LINES = 256  # lines read between turns of the event loop


def _digest(custom_id: str) -> bytes:
    return hashlib.sha256(custom_id.encode()).digest()[:16]


async def failed_ids(state: ApiState, record: BatchRecord) -> set[bytes]:
    """The digests of the custom ids the job's error file names; 409 when it has none."""
    if record.error_file_id is None:
        raise _nothing_to_retry(record)
    found: set[bytes] = set()
    try:
        async for number, line in _numbered(state.object_store.lines(record.error_file_id, MAX_LINE_BYTES)):
            custom_id = custom_id_of(line)
            if custom_id is not None:
                found.add(_digest(custom_id))
            if number % YIELD_EVERY_LINES == 0:
                await asyncio.sleep(0)
    except (ObjectNotFound, LineTooLong) as error:
        raise ApiError(
            409, "error_file_gone", f"the error file of {record.batch_id} was deleted or expired", headers=NO_RETRY
        ) from error
    if not found:
        raise _nothing_to_retry(record)
    return found


async def retry_input(state: ApiState, record: BatchRecord, failed: set[bytes], room: int) -> FileRecord:
    """The new input file: the job's failed lines, read again from its input, each once,
    in order; at most ``room`` bytes (413 past it)."""
    file_id = new_file_id()
    try:
        async with state.object_store.writer(file_id) as writer:
            lines = state.object_store.lines(record.input_file_id, MAX_LINE_BYTES)
            async for number, line in _numbered(lines):
                custom_id = custom_id_of(line)
                if custom_id is not None and (digest := _digest(custom_id)) in failed:
                    failed.discard(digest)  # once: a repeated custom_id was refused the first time
                    if writer.written + len(line) + 1 > room:
                        raise ApiError(
                            413, "storage_quota_exceeded", "the retry's input would pass this tenant's quota"
                        )
                    await writer.write(line + b"\n")
                if number % YIELD_EVERY_LINES == 0:
                    await asyncio.sleep(0)
    except ObjectNotFound as error:
        raise ApiError(
            409, "input_file_gone", f"the input file of {record.batch_id} was deleted or expired", headers=NO_RETRY
        ) from error
    except LineTooLong as error:
        raise ApiError(
            409, "input_unreadable", f"a line of {record.batch_id}'s input is too long", headers=NO_RETRY
        ) from error
    retry_file = FileRecord(
        file_id, record.tenant, f"{record.batch_id}_retry.jsonl", writer.written, "batch", int(time.time())
    )
    await state.file_records.add(retry_file)
    return retry_file


async def _numbered(lines: AsyncIterator[bytes]) -> AsyncIterator[tuple[int, bytes]]:
    """The non-blank lines, each with its number (from 1)."""
    number = 0
    async for line in non_blank(lines):
        number += 1
        yield number, line


def _nothing_to_retry(record: BatchRecord) -> ApiError:
    return ApiError(409, "nothing_to_retry", f"batch {record.batch_id} has no failed line to retry", headers=NO_RETRY)
