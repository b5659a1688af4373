"""A Python client for Brimful's API, synchronous (``Client``) and asyncio (``AsyncClient``).

    with Client("http://127.0.0.1:8080") as brimful:
        task_id = brimful.submit({"TEXT": "hello"})
        outputs = brimful.result(task_id)              # long-polls, no busy loop
        every = brimful.map([{"TEXT": t} for t in texts])  # outputs in input order

Both honour ``Retry-After`` on 429 and 503, and a submission keeps one
``Idempotency-Key`` across its retries, so a retried POST never makes a second task.

Every operation is written once, as a plan: a generator that yields the HTTP requests
and pauses it needs and gets each answer back. ``Client`` and ``AsyncClient`` only drive
plans, one blocking and one with asyncio; they hold no logic of their own.
"""

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
    Retry-After is honoured; a lost connection backs off exponentially."""
    if attempt >= policy.attempts:
        return None
    if response is not None:
        # 409 with Retry-After: an earlier try with this Idempotency-Key is still being accepted.
        in_use = response.status_code == 409 and "retry-after" in response.headers
        if response.status_code not in _RETRYABLE and not in_use:
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


def call_plan(retry: RetryPolicy, method: str, path: str, **options: Any) -> Plan:
    """One API call, retried as ``retry`` and the server's Retry-After say."""
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
                return raise_for_error(response)
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


# --- the two drivers ----------------------------------------------------------------------


class _Connection:
    """Where both clients send their calls, and how they retry them."""

    _http_class: type[httpx.Client] | type[httpx.AsyncClient]

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        retry: RetryPolicy = RetryPolicy(),
        transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
    ) -> None:
        http_class: Any = self._http_class  # each subclass passes the transport its client takes
        self._http: Any = http_class(**http_options(base_url, api_key, timeout_s), transport=transport)
        self._retry = retry


class Client(_Connection):
    """Synchronous client."""

    _http_class = httpx.Client

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _run(self, plan: Plan) -> Any:
        runner = PlanRunner(plan)
        while (step := runner.next_step()) is not None:
            runner.settle(lambda: step.perform(self._http))
        return runner.result

    def submit(
        self,
        inputs: Mapping[str, Any],
        deadline_ms: int | None = None,
        idempotency_key: str | None = None,
        model: str | None = None,
        priority: str | None = None,
        cache: bool | None = None,
    ) -> str:
        """Submit one task (to ``model``, or the default model; see ``task_fields`` for
        ``priority`` and ``cache``); returns its task_id (the same one on every retry)."""
        fields = task_fields(model, priority, cache)
        return str(self._run(submit_plan(self._retry, inputs, deadline_ms, idempotency_key, fields)))

    def models(self) -> list[dict[str, Any]]:
        """The models served: name, kind, version, batch_size, inputs, outputs, default."""
        return list(self._run(call_plan(self._retry, "GET", "/v1/models"))["models"])

    def embed(self, texts: Sequence[str], model: str) -> list[list[float]]:
        """A vector for each text, in order, from an embedding model (``POST /v1/embeddings``:
        each text a task, batched with everyone else's rows)."""
        return vectors(self._run(call_plan(self._retry, "POST", "/v1/embeddings", json=embed_body(texts, model))))

    def status(self, task_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        """The task as the API shows it, held up to ``wait_s`` for it to finish."""
        return dict(self._run(status_plan(self._retry, task_id, wait_s)))

    def result(self, task_id: str, timeout_s: float = 300.0, poll_wait_s: float = 25.0) -> dict[str, Any]:
        """The task's outputs once done (TaskFailed if it failed); long-polls until then."""
        return dict(self._run(result_plan(self._retry, task_id, timeout_s, poll_wait_s)))

    def cancel(self, task_id: str) -> dict[str, Any]:
        return dict(self._run(call_plan(self._retry, "DELETE", f"/v1/tasks/{task_id}")))

    def map(
        self,
        inputs: Iterable[Mapping[str, Any]],
        chunk: int = 500,
        timeout_s: float = 600.0,
        model: str | None = None,
        priority: str | None = None,
        cache: bool | None = None,
    ) -> list[dict[str, Any]]:
        """Outputs for every input, in input order (TaskFailed on the first that failed)."""
        task_ids = self._run(submit_all_plan(self._retry, inputs, chunk, task_fields(model, priority, cache)))
        return [self.result(task_id, timeout_s=timeout_s) for task_id in task_ids]


class AsyncClient(_Connection):
    """asyncio client; ``map`` keeps up to ``concurrency`` results in flight."""

    _http_class = httpx.AsyncClient

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _run(self, plan: Plan) -> Any:
        runner = PlanRunner(plan)
        while (step := runner.next_step()) is not None:
            await runner.settle_async(step.perform_async(self._http))
        return runner.result

    async def submit(
        self,
        inputs: Mapping[str, Any],
        deadline_ms: int | None = None,
        idempotency_key: str | None = None,
        model: str | None = None,
        priority: str | None = None,
        cache: bool | None = None,
    ) -> str:
        fields = task_fields(model, priority, cache)
        return str(await self._run(submit_plan(self._retry, inputs, deadline_ms, idempotency_key, fields)))

    async def models(self) -> list[dict[str, Any]]:
        return list((await self._run(call_plan(self._retry, "GET", "/v1/models")))["models"])

    async def embed(self, texts: Sequence[str], model: str) -> list[list[float]]:
        return vectors(await self._run(call_plan(self._retry, "POST", "/v1/embeddings", json=embed_body(texts, model))))

    async def status(self, task_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        return dict(await self._run(status_plan(self._retry, task_id, wait_s)))

    async def result(self, task_id: str, timeout_s: float = 300.0, poll_wait_s: float = 25.0) -> dict[str, Any]:
        return dict(await self._run(result_plan(self._retry, task_id, timeout_s, poll_wait_s)))

    async def cancel(self, task_id: str) -> dict[str, Any]:
        return dict(await self._run(call_plan(self._retry, "DELETE", f"/v1/tasks/{task_id}")))

    async def map(
        self,
        inputs: Iterable[Mapping[str, Any]],
        chunk: int = 500,
        concurrency: int = 64,
        timeout_s: float = 600.0,
        model: str | None = None,
        priority: str | None = None,
        cache: bool | None = None,
    ) -> list[dict[str, Any]]:
        """Outputs for every input, in input order (TaskFailed on the first that failed)."""
        task_ids = await self._run(submit_all_plan(self._retry, inputs, chunk, task_fields(model, priority, cache)))
        gate = asyncio.Semaphore(concurrency)

        async def one(task_id: str) -> dict[str, Any]:
            async with gate:
                return await self.result(task_id, timeout_s=timeout_s)

        return list(await asyncio.gather(*(one(task_id) for task_id in task_ids)))


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
