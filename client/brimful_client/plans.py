"""Every operation of the client, written once as a plan: a generator that yields the HTTP
requests and pauses it needs and gets each answer back, with no I/O of its own. The retry
policy, the errors, and the requests and answers each call makes and reads are here;
``client.py`` drives the plans, blocking or with asyncio."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

_RETRYABLE = {429, 502, 503, 504}
_FINAL = {"done", "failed", "cancelled", "expired"}


class BrimfulError(Exception):
    """The API refused a call; ``code`` is its error code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class TaskFailed(BrimfulError):
    """The task ended ``failed``, ``cancelled`` or ``expired``; ``task`` is its last state."""

    def __init__(self, task: Mapping[str, Any]) -> None:
        error = task.get("error") or {}
        super().__init__(
            200, str(error.get("class", task.get("status"))), str(error.get("message", task.get("status")))
        )
        self.task = dict(task)


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep trying a call the server asked to retry."""

    attempts: int = 10
    max_delay_s: float = 30.0
    first_delay_s: float = 0.2


def retry_delay(policy: RetryPolicy, attempt: int, response: httpx.Response | None) -> float | None:
    """Seconds to wait before attempt ``attempt + 1``; None to give up. A response's
    retry-after-ms, else Retry-After, is honoured; a lost connection backs off exponentially."""
    if attempt >= policy.attempts:
        return None
    if response is not None:
        # 409 with Retry-After: an earlier try with this Idempotency-Key is still being accepted.
        in_use = response.status_code == 409 and "retry-after" in response.headers
        if response.status_code not in _RETRYABLE and not in_use:
            return None
        milliseconds = response.headers.get("retry-after-ms", "")
        if milliseconds.isascii() and milliseconds.isdigit():  # finer than Retry-After: read first
            return min(policy.max_delay_s, int(milliseconds) / 1000)
        header = response.headers.get("retry-after", "")
        if header.isascii() and header.isdigit():
            return min(policy.max_delay_s, float(header))
    return min(policy.max_delay_s, policy.first_delay_s * 2.0 ** (attempt - 1))


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


def provenance_of(task: Mapping[str, Any]) -> dict[str, Any]:
    """A task answer's provenance ({} where it has none)."""
    return dict(task.get("provenance") or {})


def task_fields(model: str | None = None, priority: str | None = None, cache: bool | None = None) -> dict[str, Any]:
    """What a task says besides its inputs, where it says anything: the model (None: the
    default), ``priority`` ("low": bulk work that fills the slots others leave empty) and
    ``cache`` (False: a model call of its own, never an identical task's result)."""
    fields: dict[str, Any] = {}
    if model is not None:
        fields["model"] = model
    if priority is not None:
        fields["priority"] = priority
    if cache is not None:
        fields["cache"] = cache
    return fields


def submit_request(
    inputs: Mapping[str, Any], deadline_ms: int | None, key: str, fields: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": dict(inputs), **(fields or {})}
    if deadline_ms is not None:
        body["deadline_ms"] = deadline_ms
    return {"json": body, "headers": {"Idempotency-Key": key}}


def http_options(base_url: str, api_key: str | None, timeout_s: float) -> dict[str, Any]:
    """What both clients give their httpx client: where, who, and how long to wait."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return {"base_url": base_url, "headers": headers, "timeout": timeout_s}


# --- plans: each operation once, as the requests and pauses it needs ---------------------


@dataclass(frozen=True)
class Send:
    """Make this HTTP request; the plan gets the ``httpx.Response`` back (or the
    ``httpx.TransportError`` thrown into it)."""

    method: str
    path: str
    options: dict[str, Any] = field(default_factory=dict)

    def perform(self, http: httpx.Client) -> httpx.Response:
        return http.request(self.method, self.path, **self.options)

    async def perform_async(self, http: httpx.AsyncClient) -> httpx.Response:
        return await http.request(self.method, self.path, **self.options)


@dataclass(frozen=True)
class Pause:
    """Wait this long before the plan goes on."""

    seconds: float

    def perform(self, http: httpx.Client) -> None:
        time.sleep(self.seconds)

    async def perform_async(self, http: httpx.AsyncClient) -> None:
        await asyncio.sleep(self.seconds)


class PlanRunner:
    """Steps one plan: hands it the outcome of its last step, takes its next one. The
    drivers only perform the steps, blocking or with asyncio."""

    def __init__(self, plan: Plan) -> None:
        self._plan = plan
        self._answer: Any = None
        self._error: httpx.TransportError | None = None
        self.result: Any = None

    def next_step(self) -> Send | Pause | None:
        """The plan's next step; None once it has finished (its value is ``result``)."""
        error, self._error = self._error, None
        try:
            return self._plan.throw(error) if error is not None else self._plan.send(self._answer)
        except StopIteration as finished:
            self.result = finished.value
            return None

    def settle(self, perform: Callable[[], Any]) -> None:
        try:
            self._answer = perform()
        except httpx.TransportError as error:
            self._error = error

    async def settle_async(self, pending: Awaitable[Any]) -> None:
        try:
            self._answer = await pending
        except httpx.TransportError as error:
            self._error = error


Plan = Generator["Send | Pause", Any, Any]


def embed_body(texts: Sequence[str], model: str) -> dict[str, Any]:
    """An embeddings call's body: the texts as a list, answered as numbers."""
    return {"model": model, "input": list(texts), "encoding_format": "float"}


def vectors(answer: Mapping[str, Any]) -> list[list[float]]:
    """The vectors of an embeddings answer, in input order."""
    return [item["embedding"] for item in sorted(answer["data"], key=lambda item: item["index"])]


def call_plan(
    retry: RetryPolicy, method: str, path: str, read: Callable[[httpx.Response], Any] = raise_for_error, **options: Any
) -> Plan:
    """One API call, retried as ``retry`` and the server's Retry-After say; ``read`` turns
    the final answer into the call's value (default: its JSON, or BrimfulError)."""
    attempt = 0
    while True:
        attempt += 1
        try:
            response = yield Send(method, path, options)
        except httpx.TransportError:
            if (delay := retry_delay(retry, attempt, None)) is None:
                raise
        else:
            if (delay := retry_delay(retry, attempt, response)) is None:
                return read(response)
        yield Pause(delay)


def submit_plan(
    retry: RetryPolicy,
    inputs: Mapping[str, Any],
    deadline_ms: int | None,
    key: str | None,
    fields: Mapping[str, Any] | None = None,
) -> Plan:
    request = submit_request(inputs, deadline_ms, key or uuid.uuid4().hex, fields)
    answer = yield from call_plan(retry, "POST", "/v1/tasks", **request)
    return str(answer["task_id"])


def status_plan(retry: RetryPolicy, task_id: str, wait_s: float) -> Plan:
    return dict((yield from call_plan(retry, "GET", f"/v1/tasks/{task_id}", params={"wait": wait_s})))


def result_plan(retry: RetryPolicy, task_id: str, timeout_s: float, poll_wait_s: float) -> Plan:
    """Long-poll until the task is final: its outputs, or TaskFailed."""
    deadline = time.monotonic() + timeout_s
    while True:
        task = yield from status_plan(retry, task_id, min(poll_wait_s, max(0.0, deadline - time.monotonic())))
        if task["status"] in _FINAL:
            return outputs_of(task)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"task {task_id} still {task['status']} after {timeout_s:g} s")


def submit_all_plan(
    retry: RetryPolicy, inputs: Iterable[Mapping[str, Any]], chunk: int, fields: Mapping[str, Any] | None = None
) -> Plan:
    """Every input submitted through the bulk route, ``chunk`` per call; their task ids in
    input order. Items refused for a passing reason are submitted again on their own."""
    task_ids: list[str] = []
    for part in _chunks(list(inputs), chunk):
        answer = yield from call_plan(retry, "POST", "/v1/tasks:batch", json=bulk_request(part, fields))
        ids, again = split_bulk_answer(answer)
        for index in again:
            ids[index] = yield from submit_plan(retry, part[index], None, None, fields)
        task_ids.extend(ids[index] for index in range(len(part)))
    return task_ids


_RETRYABLE_CODES = {"store_unavailable", "broker_unavailable", "overloaded", "dependency_unavailable"}


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def bulk_request(inputs: Sequence[Mapping[str, Any]], fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"tasks": [{"inputs": dict(item), **(fields or {})} for item in inputs]}


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
