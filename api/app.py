"""The HTTP front door: accept tasks, answer polls, report readiness and totals."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api import dlq_routes
from api.backlog import BacklogMonitor
from api.errors import (
    ApiError,
    api_error_handler,
    dependency_error_handler,
    http_error_handler,
    validation_error_handler,
)
from api.submission import parse_json, parse_submission
from batcher.live_status import StatusBoard
from batcher.tuning import PolicyTuning, TuningError
from brimful import metrics
from brimful.kafka import ensure_topics, make_producer
from brimful.model_signature import ModelSignature
from brimful.redis_client import make_redis
from brimful.redis_keys import RedisKeys
from brimful.settings import Settings
from brimful.task_store import TaskStore, now_ms
from brimful.task_status import TaskStatus
from schemas import TaskRequest
from workers.dead_letter_admin import DeadLetterAdmin
from workers.triton_model import TritonModel

log = logging.getLogger("brimful.api")

TASK_ID_PATTERN = re.compile(r"^[0-9a-f]{32}$")
IDEMPOTENCY_KEY_PATTERN = re.compile(r"^[\x21-\x7e]{1,255}$")
_READY_CHECK_TIMEOUT_S = 2.0


class ApiState:
    """What the API holds while it runs."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.redis = make_redis(settings)
        self.store = TaskStore(self.redis, RedisKeys(settings.key_prefix), settings.result_ttl_s)
        self.producer: AIOKafkaProducer = make_producer(settings)
        self.producer_started = False
        self.model = TritonModel(
            settings.triton_url, settings.model_name, settings.model_version, settings.batch_size, settings.infer_timeout_s
        )
        self.signature: ModelSignature | None = None
        self.tuning = PolicyTuning.from_settings(settings, self.redis)
        self.status_board = StatusBoard(self.redis, RedisKeys(settings.key_prefix))
        self.dead_letters = DeadLetterAdmin(settings, self.redis, self.producer, self.store)
        self.backlog = BacklogMonitor(self.status_board, self.store)
        self._background: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._background = [
            asyncio.create_task(self._load_signature(), name="load-signature"),
            asyncio.create_task(self._start_producer(), name="start-producer"),
            asyncio.create_task(self.backlog.run(), name="backlog-monitor"),
        ]

    async def stop(self) -> None:
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self.producer_started:
            await self.producer.stop()
        await self.model.close()
        await self.redis.aclose()

    async def _load_signature(self) -> None:
        # The model may still be loading when the API starts: keep asking.
        delay = 0.2
        while self.signature is None:
            try:
                self.signature = await self.model.signature()
                log.info("model signature loaded", extra={"model": self.signature.name, "inputs": self.signature.input_names})
            except Exception as error:
                log.info("waiting for model metadata", extra={"error": str(error)})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _start_producer(self) -> None:
        delay = 0.2
        while not self.producer_started:
            try:
                await ensure_topics(self.settings, attempts=1)
                await self.producer.start()
                self.producer_started = True
            except Exception as error:
                log.info("waiting for the broker", extra={"error": str(error)})
                await self.producer.stop()
                self.producer = make_producer(self.settings)
                self.dead_letters = DeadLetterAdmin(self.settings, self.redis, self.producer, self.store)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "body_too_large", f"body of {declared} bytes exceeds the limit of {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, "body_too_large", f"body exceeds the limit of {limit} bytes")
    return bytes(body)


def _state(request: Request) -> ApiState:
    return request.app.state.brimful  # type: ignore[no-any-return]


def create_app(settings: Settings) -> FastAPI:
    """Build the FastAPI application for these settings."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = ApiState(settings)
        app.state.brimful = state
        await state.start()
        try:
            yield
        finally:
            await state.stop()

    app = FastAPI(
        title="Brimful",
        version="0.1.0",
        summary="Submit single inference tasks; Brimful runs them in full fixed-size batches.",
        lifespan=lifespan,
    )
    app.include_router(dlq_routes.router)
    app.add_exception_handler(ApiError, api_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(RedisError, dependency_error_handler)
    app.add_exception_handler(KafkaError, dependency_error_handler)

    @app.post("/v1/tasks", status_code=202)
    async def submit_task(request: Request) -> JSONResponse:
        """Accept one task; answer 202 with its task_id once it is durably queued."""
        state = _state(request)
        body = await _read_body(request, settings.max_body_bytes)
        document = parse_json(body)
        if state.signature is None:
            raise ApiError(503, "model_not_ready", "the model's metadata is not loaded yet", {"Retry-After": "1"})
        submission = parse_submission(document, state.signature)
        if not state.producer_started:
            raise ApiError(503, "broker_unavailable", "the broker is not reachable yet", {"Retry-After": "1"})

        task_id = uuid.uuid4().hex
        idempotency_key = request.headers.get("idempotency-key")
        if idempotency_key is not None:
            if not IDEMPOTENCY_KEY_PATTERN.match(idempotency_key):
                raise ApiError(400, "invalid_idempotency_key", "Idempotency-Key must be 1-255 visible ASCII characters")
            original = await state.store.claim_idempotency_key(idempotency_key, task_id)
            if original is not None:
                record = await state.store.get(original)
                status = record.status.value if record else TaskStatus.QUEUED.value
                return JSONResponse(
                    {"task_id": original, "status": status}, status_code=200, headers={"Idempotent-Replayed": "true"}
                )
        backlog = state.backlog.backlog
        if backlog > settings.max_backlog:
            await state.store.release_idempotency_key(idempotency_key, task_id)
            retry_after = state.backlog.retry_after_s(settings.max_backlog)
            raise ApiError(
                503,
                "overloaded",
                f"{backlog} accepted tasks are still unfinished (limit {settings.max_backlog}); "
                f"retry in about {retry_after} s",
                {"Retry-After": str(retry_after)},
            )
        submitted_at = now_ms()
        message = TaskRequest(
            task_id=task_id,
            model=state.signature.name,
            submitted_at_ms=submitted_at,
            deadline_at_ms=submitted_at + submission.deadline_ms if submission.deadline_ms else 0,
        )
        for name, tensor in submission.inputs.items():
            message.inputs[name].CopyFrom(tensor)
        try:
            await state.store.create_queued(task_id, submitted_at)
        except RedisError as error:
            log.error("could not record task", extra={"task_id": task_id, "error": str(error)})
            await state.store.release_idempotency_key(idempotency_key, task_id)
            raise ApiError(503, "store_unavailable", "the result store is unreachable", {"Retry-After": "1"}) from error
        try:
            sent = await state.producer.send_and_wait(
                settings.requests_topic, value=message.SerializeToString(), key=task_id.encode()
            )
        except KafkaError as error:
            log.error("could not enqueue task", extra={"task_id": task_id, "error": str(error)})
            await state.store.forget(task_id)
            await state.store.release_idempotency_key(idempotency_key, task_id)
            raise ApiError(503, "broker_unavailable", "the broker did not accept the task", {"Retry-After": "1"}) from error
        state.backlog.produced(sent.partition, sent.offset)
        metrics.TASKS_SUBMITTED.inc()
        return JSONResponse({"task_id": task_id, "status": TaskStatus.QUEUED.value}, status_code=202)

    @app.get("/v1/tasks/{task_id}")
    async def get_task(task_id: str, request: Request) -> dict[str, Any]:
        """The task's status, with outputs once done or the error once failed."""
        if not TASK_ID_PATTERN.match(task_id):
            raise ApiError(400, "malformed_task_id", f"task_id {task_id[:64]!r} is not 32 lowercase hex characters")
        record = await _state(request).store.get(task_id)
        if record is None:
            raise ApiError(404, "task_not_found", f"no task {task_id} (unknown, or expired after the retention time)")
        answer: dict[str, Any] = {
            "task_id": task_id,
            "status": record.status.value,
            "submitted_at_ms": record.submitted_at_ms,
            "updated_at_ms": record.updated_at_ms,
        }
        if record.status is TaskStatus.DONE:
            answer["outputs"] = record.outputs
        if record.status is TaskStatus.FAILED:
            answer["error"] = record.error
        return answer

    @app.get("/v1/stats")
    async def stats(request: Request) -> dict[str, Any]:
        """Totals across every batcher: batches sent to the model, real rows in them, padding."""
        state = _state(request)
        counters = await state.store.stats()
        batches = counters["batches_dispatched"]
        answer: dict[str, Any] = dict(counters)
        answer["mean_rows_per_batch"] = round(counters["rows_dispatched"] / batches, 2) if batches else 0.0
        answer["batchers"] = await state.status_board.read_all()
        return answer

    @app.get("/v1/admin/policy")
    async def get_policy(request: Request) -> dict[str, Any]:
        """The flush-policy parameters every batcher uses now, their defaults, recent changes."""
        tuning = _state(request).tuning
        return {"params": await tuning.values(), "defaults": tuning.defaults, "history": await tuning.history()}

    @app.patch("/v1/admin/policy")
    async def change_policy(request: Request) -> dict[str, Any]:
        """Change flush-policy parameters of every running batcher (applied within ~1 s)."""
        document = parse_json(await _read_body(request, 64 * 1024))
        if not isinstance(document, dict):
            raise ApiError(422, "invalid_request", 'body must be a JSON object like {"max_wait_ms": 100}')
        actor = request.headers.get("x-brimful-actor", request.client.host if request.client else "")
        try:
            return await _state(request).tuning.update(document, actor=actor)
        except TuningError as error:
            raise ApiError(422, "invalid_policy", str(error)) from error

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> Response:
        """This process's Prometheus metrics."""
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        """Readiness: 200 only when the broker, Redis and the model are all reachable."""
        state = _state(request)

        async def broker() -> bool:
            if not state.producer_started:
                return False
            await state.producer.client.fetch_all_metadata()
            return True

        async def redis() -> bool:
            return bool(await state.redis.ping())

        async def model() -> bool:
            return state.signature is not None and await state.model.is_ready()

        async def check(probe: Any) -> bool:
            try:
                return bool(await asyncio.wait_for(probe(), timeout=_READY_CHECK_TIMEOUT_S))
            except Exception:
                return False

        results = await asyncio.gather(check(broker), check(redis), check(model))
        checks = dict(zip(("broker", "redis", "model"), results))
        ready = all(results)
        return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)

    return app
