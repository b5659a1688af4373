"""Plans for OpenAI-style batch jobs (a JSONL file of requests run as low-priority tasks)
and for webhook endpoints: the requests each operation makes, with no I/O of their own."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import httpx

from brimful_client.plans import Pause, Plan, RetryPolicy, call_plan, raise_for_error

BATCH_ENDPOINTS = ("/v1/tasks", "/v1/embeddings")
BATCH_FINAL = {"completed", "failed", "expired", "cancelled"}

Progress = Callable[[Mapping[str, Any]], None]  # called with the job at every poll


def jsonl(lines: Iterable[Mapping[str, Any]] | bytes) -> bytes:
    """A batch input file: request lines as JSON, one a line (bytes are taken as they are)."""
    if isinstance(lines, bytes):
        return lines
    return b"".join(json.dumps(line, separators=(",", ":")).encode() + b"\n" for line in lines)


def task_lines(inputs: Iterable[Mapping[str, Any]], model: str | None = None) -> list[dict[str, Any]]:
    """Batch lines for Brimful's own task route, ``custom_id`` the input's position."""
    body = {"model": model} if model is not None else {}
    return [
        {"custom_id": str(index), "method": "POST", "url": "/v1/tasks", "body": {"inputs": dict(item), **body}}
        for index, item in enumerate(inputs)
    ]


def read_bytes(response: httpx.Response) -> bytes:
    """A file's content, or BrimfulError."""
    if response.status_code >= 400:
        raise_for_error(response)
    return response.content


def create_batch_plan(
    retry: RetryPolicy,
    content: bytes,
    endpoint: str,
    metadata: Mapping[str, str] | None,
    filename: str,
    invalid_lines: str | None = None,
) -> Plan:
    """Upload ``content`` (purpose batch) and start a job over it; the job as created. Each
    create carries an Idempotency-Key of its own, so a retry never makes a second one.
    ``invalid_lines``: ``fail`` (the server's default: a file with an invalid line fails at
    validating) or ``error_file`` (the valid lines run)."""
    if endpoint not in BATCH_ENDPOINTS:
        raise ValueError(f"endpoint must be one of {', '.join(BATCH_ENDPOINTS)}, not {endpoint!r}")
    upload = yield from call_plan(
        retry,
        "POST",
        "/v1/files",
        data={"purpose": "batch"},
        files={"file": (filename, content, "application/jsonl")},
        headers={"Idempotency-Key": f"upload-{uuid.uuid4().hex}"},
    )
    body: dict[str, Any] = {"input_file_id": upload["id"], "endpoint": endpoint, "completion_window": "24h"}
    if metadata:
        body["metadata"] = dict(metadata)
    if invalid_lines:
        body["invalid_lines"] = invalid_lines
    key = {"Idempotency-Key": f"batch-{uuid.uuid4().hex}"}
    return dict((yield from call_plan(retry, "POST", "/v1/batches", json=body, headers=key)))


def batch_plan(retry: RetryPolicy, batch_id: str) -> Plan:
    return dict((yield from call_plan(retry, "GET", f"/v1/batches/{batch_id}")))


def wait_batch_plan(
    retry: RetryPolicy, batch_id: str, timeout_s: float, poll_s: float, progress: Progress | None
) -> Plan:
    """Poll the job every ``poll_s`` until it ends; the job as it ended (TimeoutError past
    ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        batch = yield from batch_plan(retry, batch_id)
        if progress is not None:
            progress(batch)
        if batch["status"] in BATCH_FINAL:
            return batch
        if time.monotonic() >= deadline:
            raise TimeoutError(f"batch {batch_id} still {batch['status']} after {timeout_s:g} s")
        yield Pause(poll_s)


def cancel_batch_plan(retry: RetryPolicy, batch_id: str) -> Plan:
    return dict((yield from call_plan(retry, "POST", f"/v1/batches/{batch_id}/cancel")))


def retry_batch_plan(retry: RetryPolicy, batch_id: str) -> Plan:
    """Run an ended job's failed lines again as a new job (under an Idempotency-Key of its
    own, so a retried call makes one); the new job."""
    key = {"Idempotency-Key": f"retry-{uuid.uuid4().hex}"}
    return dict((yield from call_plan(retry, "POST", f"/v1/batches/{batch_id}/retry", headers=key)))


def file_lines_plan(retry: RetryPolicy, file_id: str | None) -> Plan:
    """A result file's lines, parsed; none for no file."""
    if not file_id:
        return []
    content = yield from call_plan(retry, "GET", f"/v1/files/{file_id}/content", read=read_bytes)
    return [json.loads(line) for line in content.splitlines() if line.strip()]


def by_custom_id(lines: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """An output file's lines by ``custom_id`` (the job answers each id there once)."""
    return {str(line["custom_id"]): dict(line) for line in lines}


def add_webhook_plan(retry: RetryPolicy, url: str, events: Iterable[str], description: str) -> Plan:
    """Register an endpoint; the answer carries its signing secret (shown this once)."""
    body = {"url": url, "events": list(events), "description": description}
    return dict((yield from call_plan(retry, "POST", "/v1/webhooks/endpoints", json=body)))


def webhooks_plan(retry: RetryPolicy) -> Plan:
    return list((yield from call_plan(retry, "GET", "/v1/webhooks/endpoints"))["data"])


def remove_webhook_plan(retry: RetryPolicy, endpoint_id: str) -> Plan:
    return dict((yield from call_plan(retry, "DELETE", f"/v1/webhooks/endpoints/{endpoint_id}")))
