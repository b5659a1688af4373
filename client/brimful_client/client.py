"""A Python client for Brimful's API, synchronous (``Client``) and asyncio (``AsyncClient``).

    with Client("http://127.0.0.1:8080") as brimful:
        task_id = brimful.submit({"TEXT": "hello"})
        outputs = brimful.result(task_id)              # long-polls, no busy loop
        every = brimful.map([{"TEXT": t} for t in texts])  # outputs in input order
        job = brimful.wait_batch(brimful.create_batch(task_lines(rows))["id"])
        answers = brimful.batch_output(job)            # by custom_id

Both honour ``Retry-After`` on 429 and 503, and a submission keeps one
``Idempotency-Key`` across its retries, so a retried POST never makes a second task.

Every operation is written once, as a plan (``plans.py``): a generator that yields the HTTP requests
and pauses it needs and gets each answer back. ``Client`` and ``AsyncClient`` only drive
plans, one blocking and one with asyncio; they hold no logic of their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import httpx

from brimful_client.job_plans import (
    Progress,
    add_webhook_plan,
    batch_plan,
    by_custom_id,
    cancel_batch_plan,
    create_batch_plan,
    file_lines_plan,
    jsonl,
    remove_webhook_plan,
    retry_batch_plan,
    wait_batch_plan,
    webhooks_plan,
)
from brimful_client.plans import (
    BrimfulError,
    Plan,
    PlanRunner,
    RetryPolicy,
    TaskFailed,
    call_plan,
    embed_body,
    http_options,
    provenance_of,
    result_plan,
    status_plan,
    submit_all_plan,
    submit_plan,
    task_fields,
    vectors,
)

__all__ = ["AsyncClient", "BrimfulError", "Client", "RetryPolicy", "TaskFailed"]

DEFAULT_RETRY = RetryPolicy()

# --- the two drivers ----------------------------------------------------------------------


class _Connection:
    """Where both clients send their calls, and how they retry them."""

    _http_class: type[httpx.Client] | type[httpx.AsyncClient]

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        retry: RetryPolicy = DEFAULT_RETRY,
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

    def provenance(self, task_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        """A done task's batch and where its time went (batch_id, rows, padded_rows,
        flush_reason, endpoint, stages_ms); {} until it is done, or where none was stored."""
        return provenance_of(self.status(task_id, wait_s))

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

    # --- batch jobs (OpenAI's Batch API) and webhook endpoints ---

    def create_batch(
        self,
        lines: Iterable[Mapping[str, Any]] | bytes,
        endpoint: str = "/v1/tasks",
        metadata: Mapping[str, str] | None = None,
        filename: str = "batch.jsonl",
        invalid_lines: str | None = None,
    ) -> dict[str, Any]:
        """Upload request lines (``task_lines`` makes them from inputs) and start a batch job
        over them: each line a low-priority task. Returns the job (``id``, ``status``, ...).
        ``invalid_lines="error_file"`` runs the valid lines of a file with invalid ones."""
        plan = create_batch_plan(self._retry, jsonl(lines), endpoint, metadata, filename, invalid_lines)
        return dict(self._run(plan))

    def batch(self, batch_id: str) -> dict[str, Any]:
        return dict(self._run(batch_plan(self._retry, batch_id)))

    def wait_batch(
        self, batch_id: str, timeout_s: float = 86_400.0, poll_s: float = 2.0, progress: Progress | None = None
    ) -> dict[str, Any]:
        """The job once it has ended (completed, failed, expired or cancelled); ``progress``
        is called with the job at every poll (its ``request_counts`` say how far it is)."""
        return dict(self._run(wait_batch_plan(self._retry, batch_id, timeout_s, poll_s, progress)))

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        return dict(self._run(cancel_batch_plan(self._retry, batch_id)))

    def retry_batch(self, batch_id: str) -> dict[str, Any]:
        """A new job over the failed lines of an ended one (``retry_of`` names it)."""
        return dict(self._run(retry_batch_plan(self._retry, batch_id)))

    def batch_output(self, batch: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """The output file's lines of an ended job, by ``custom_id``: each line's
        ``response`` holds its status_code and body."""
        return by_custom_id(self._run(file_lines_plan(self._retry, batch.get("output_file_id"))))

    def batch_errors(self, batch: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The error file's lines: lines that failed or could not be read (one of those may
        have no ``custom_id``, or repeat another line's)."""
        return list(self._run(file_lines_plan(self._retry, batch.get("error_file_id"))))

    def add_webhook(self, url: str, events: Iterable[str], description: str = "") -> dict[str, Any]:
        """Register a webhook endpoint (admin key); the answer holds its secret, this once."""
        return dict(self._run(add_webhook_plan(self._retry, url, events, description)))

    def webhooks(self) -> list[dict[str, Any]]:
        return list(self._run(webhooks_plan(self._retry)))

    def remove_webhook(self, endpoint_id: str) -> dict[str, Any]:
        return dict(self._run(remove_webhook_plan(self._retry, endpoint_id)))


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

    async def provenance(self, task_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        return provenance_of(await self.status(task_id, wait_s))

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

    # --- batch jobs (OpenAI's Batch API) and webhook endpoints ---

    async def create_batch(
        self,
        lines: Iterable[Mapping[str, Any]] | bytes,
        endpoint: str = "/v1/tasks",
        metadata: Mapping[str, str] | None = None,
        filename: str = "batch.jsonl",
        invalid_lines: str | None = None,
    ) -> dict[str, Any]:
        plan = create_batch_plan(self._retry, jsonl(lines), endpoint, metadata, filename, invalid_lines)
        return dict(await self._run(plan))

    async def batch(self, batch_id: str) -> dict[str, Any]:
        return dict(await self._run(batch_plan(self._retry, batch_id)))

    async def wait_batch(
        self, batch_id: str, timeout_s: float = 86_400.0, poll_s: float = 2.0, progress: Progress | None = None
    ) -> dict[str, Any]:
        return dict(await self._run(wait_batch_plan(self._retry, batch_id, timeout_s, poll_s, progress)))

    async def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        return dict(await self._run(cancel_batch_plan(self._retry, batch_id)))

    async def retry_batch(self, batch_id: str) -> dict[str, Any]:
        return dict(await self._run(retry_batch_plan(self._retry, batch_id)))

    async def batch_output(self, batch: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        return by_custom_id(await self._run(file_lines_plan(self._retry, batch.get("output_file_id"))))

    async def batch_errors(self, batch: Mapping[str, Any]) -> list[dict[str, Any]]:
        return list(await self._run(file_lines_plan(self._retry, batch.get("error_file_id"))))

    async def add_webhook(self, url: str, events: Iterable[str], description: str = "") -> dict[str, Any]:
        return dict(await self._run(add_webhook_plan(self._retry, url, events, description)))

    async def webhooks(self) -> list[dict[str, Any]]:
        return list(await self._run(webhooks_plan(self._retry)))

    async def remove_webhook(self, endpoint_id: str) -> dict[str, Any]:
        return dict(await self._run(remove_webhook_plan(self._retry, endpoint_id)))
