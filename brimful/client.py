"""A Python client for Brimful's API, synchronous (``Client``) and asyncio (``AsyncClient``).

    with Client("http://127.0.0.1:8080") as brimful:
        task_id = brimful.submit({"TEXT": "hello"})
        outputs = brimful.result(task_id)              # long-polls, no busy loop
        every = brimful.map([{"TEXT": t} for t in texts])  # outputs in input order

Both honour ``Retry-After`` on 429 and 503, and a submission keeps one
``Idempotency-Key`` across its retries, so a retried POST never makes a second task.
The two classes share every decision (the functions below); they differ only in how
they wait.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import httpx

_RETRYABLE = {429, 502, 503, 504}
_FINAL = {"done", "failed", "cancelled"}


class BrimfulError(Exception):
    """The API refused a call; ``code`` is its error code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class TaskFailed(BrimfulError):
    """The task ended ``failed`` or ``cancelled``; ``task`` is its last state."""

    def __init__(self, task: Mapping[str, Any]) -> None:
        error = task.get("error") or {}
        super().__init__(200, str(error.get("class", task.get("status"))), str(error.get("message", task.get("status"))))
        self.task = dict(task)


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep trying a call the server asked to retry."""

    attempts: int = 10
    max_delay_s: float = 30.0
    first_delay_s: float = 0.2


def retry_delay(policy: RetryPolicy, attempt: int, response: httpx.Response | None) -> float | None:
    """Seconds to wait before attempt ``attempt + 1``; None to give up. A response's
    Retry-After is honoured; a lost connection backs off exponentially."""
    if attempt >= policy.attempts:
        return None
    if response is not None:
        if response.status_code not in _RETRYABLE:
            return None
        header = response.headers.get("retry-after", "")
        if header.isdigit():
            return min(policy.max_delay_s, float(header))
    return min(policy.max_delay_s, policy.first_delay_s * 2 ** (attempt - 1))


def raise_for_error(response: httpx.Response) -> Any:
    """The JSON body of a success, or BrimfulError with the server's code and message."""
    body = response.json() if response.content else None
    if response.status_code >= 400:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        raise BrimfulError(response.status_code, error.get("code", "http_error"), error.get("message", response.text))
    return body


def outputs_of(task: Mapping[str, Any]) -> dict[str, Any]:
    """A finished task's outputs, or TaskFailed."""
    if task["status"] != "done":
        raise TaskFailed(task)
    return dict(task["outputs"])


def submit_request(inputs: Mapping[str, Any], deadline_ms: int | None, key: str) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": dict(inputs)}
    if deadline_ms is not None:
        body["deadline_ms"] = deadline_ms
    return {"json": body, "headers": {"Idempotency-Key": key}}


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class Client:
    """Synchronous client."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        retry: RetryPolicy = RetryPolicy(),
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(base_url=base_url, headers=_headers(api_key), timeout=timeout_s, transport=transport)
        self._retry = retry

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        attempt = 0
        while True:
            attempt += 1
            response: httpx.Response | None = None
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError:
                if (delay := retry_delay(self._retry, attempt, None)) is None:
                    raise
            else:
                if (delay := retry_delay(self._retry, attempt, response)) is None:
                    return raise_for_error(response)
            time.sleep(delay)

    def submit(self, inputs: Mapping[str, Any], deadline_ms: int | None = None, idempotency_key: str | None = None) -> str:
        """Submit one task; returns its task_id (the same one on every retry)."""
        key = idempotency_key or uuid.uuid4().hex
        return str(self._call("POST", "/v1/tasks", **submit_request(inputs, deadline_ms, key))["task_id"])

    def status(self, task_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        """The task as the API shows it, held up to ``wait_s`` for it to finish."""
        return dict(self._call("GET", f"/v1/tasks/{task_id}", params={"wait": wait_s}))

    def result(self, task_id: str, timeout_s: float = 300.0, poll_wait_s: float = 25.0) -> dict[str, Any]:
        """The task's outputs once done (TaskFailed if it failed); long-polls until then."""
        deadline = time.monotonic() + timeout_s
        while True:
            task = self.status(task_id, wait_s=min(poll_wait_s, max(0.0, deadline - time.monotonic())))
            if task["status"] in _FINAL:
                return outputs_of(task)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"task {task_id} still {task['status']} after {timeout_s:g} s")

    def cancel(self, task_id: str) -> dict[str, Any]:
        return dict(self._call("DELETE", f"/v1/tasks/{task_id}"))

    def map(self, inputs: Iterable[Mapping[str, Any]], chunk: int = 500, timeout_s: float = 600.0) -> list[dict[str, Any]]:
        """Outputs for every input, in input order (TaskFailed on the first that failed)."""
        task_ids: list[str] = []
        for part in _chunks(list(inputs), chunk):
            answer = self._call("POST", "/v1/tasks:batch", json=bulk_request(part))
            ids, again = split_bulk_answer(answer)
            for index in again:
                ids[index] = self.submit(part[index])
            task_ids.extend(ids[index] for index in range(len(part)))
        return [self.result(task_id, timeout_s=timeout_s) for task_id in task_ids]


class AsyncClient:
    """asyncio client; ``map`` keeps up to ``concurrency`` results in flight."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        retry: RetryPolicy = RetryPolicy(),
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, headers=_headers(api_key), timeout=timeout_s, transport=transport)
        self._retry = retry

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        attempt = 0
        while True:
            attempt += 1
            response: httpx.Response | None = None
            try:
                response = await self._http.request(method, path, **kwargs)
            except httpx.TransportError:
                if (delay := retry_delay(self._retry, attempt, None)) is None:
                    raise
            else:
                if (delay := retry_delay(self._retry, attempt, response)) is None:
                    return raise_for_error(response)
            await asyncio.sleep(delay)

    async def submit(
        self, inputs: Mapping[str, Any], deadline_ms: int | None = None, idempotency_key: str | None = None
    ) -> str:
        key = idempotency_key or uuid.uuid4().hex
        return str((await self._call("POST", "/v1/tasks", **submit_request(inputs, deadline_ms, key)))["task_id"])

    async def status(self, task_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        return dict(await self._call("GET", f"/v1/tasks/{task_id}", params={"wait": wait_s}))

    async def result(self, task_id: str, timeout_s: float = 300.0, poll_wait_s: float = 25.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            task = await self.status(task_id, wait_s=min(poll_wait_s, max(0.0, deadline - time.monotonic())))
            if task["status"] in _FINAL:
                return outputs_of(task)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"task {task_id} still {task['status']} after {timeout_s:g} s")

    async def cancel(self, task_id: str) -> dict[str, Any]:
        return dict(await self._call("DELETE", f"/v1/tasks/{task_id}"))

    async def map(
        self, inputs: Iterable[Mapping[str, Any]], chunk: int = 500, concurrency: int = 64, timeout_s: float = 600.0
    ) -> list[dict[str, Any]]:
        """Outputs for every input, in input order (TaskFailed on the first that failed)."""
        task_ids: list[str] = []
        for part in _chunks(list(inputs), chunk):
            answer = await self._call("POST", "/v1/tasks:batch", json=bulk_request(part))
            ids, again = split_bulk_answer(answer)
            for index in again:
                ids[index] = await self.submit(part[index])
            task_ids.extend(ids[index] for index in range(len(part)))
        gate = asyncio.Semaphore(concurrency)

        async def one(task_id: str) -> dict[str, Any]:
            async with gate:
                return await self.result(task_id, timeout_s=timeout_s)

        return list(await asyncio.gather(*(one(task_id) for task_id in task_ids)))


_RETRYABLE_CODES = {"store_unavailable", "broker_unavailable", "overloaded", "dependency_unavailable"}


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def bulk_request(inputs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {"tasks": [{"inputs": dict(item)} for item in inputs]}


def split_bulk_answer(answer: Mapping[str, Any]) -> tuple[dict[int, str], list[int]]:
    """(task ids by position, positions to submit again on their own). An item refused
    for a passing reason (overload, a store hiccup) is retried; one refused for its
    content raises BrimfulError naming its position."""
    ids: dict[int, str] = {}
    again: list[int] = []
    for index, result in enumerate(answer["results"]):
        if "task_id" in result:
            ids[index] = result["task_id"]
        elif result["error"]["code"] in _RETRYABLE_CODES:
            again.append(index)
        else:
            raise BrimfulError(422, result["error"]["code"], f"input {index}: {result['error']['message']}")
    return ids, again
