"""The HTTP front door: accept tasks, answer polls, report readiness and totals."""

from __future__ import annotations

import asyncio
import logging
import os
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from aiokafka.errors import KafkaError
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api import dlq_routes, openapi, task_routes
from api.auth import requires
from api.errors import (
    ApiError,
    api_error_handler,
    dependency_error_handler,
    http_error_handler,
    validation_error_handler,
)
from api.state import ApiState, api_state, read_body
from brimful.metrics import MULTIPROCESS_DIR_ENV
from api.submission import parse_json
from batcher.tuning import TuningError
from brimful.api_keys import Scope
from brimful.logs import configure_logging
from brimful.settings import Settings, get_settings

log = logging.getLogger("brimful.api")

_READY_CHECK_TIMEOUT_S = 2.0


def app_from_environment() -> FastAPI:
    """The app for one of several API workers: settings and logging from the environment."""
    configure_logging()
    return create_app(get_settings())


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
        # Brimful exports Prometheus metrics and JSON logs itself; FastAPI's own
        # OpenTelemetry hooks would only add per-request cost.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    openapi.install(app, settings, lambda: getattr(getattr(app.state, "brimful", None), "signature", None))
    app.include_router(task_routes.router)
    app.include_router(dlq_routes.router)
    app.add_exception_handler(ApiError, api_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(RedisError, dependency_error_handler)
    app.add_exception_handler(KafkaError, dependency_error_handler)

    @app.get("/v1/stats", dependencies=[Depends(requires(Scope.READ))])
    async def stats(request: Request) -> dict[str, Any]:
        """Totals across every batcher: batches sent to the model, real rows in them, padding."""
        state = api_state(request)
        counters = await state.store.stats()
        batches = counters["batches_dispatched"]
        answer: dict[str, Any] = dict(counters)
        answer["mean_rows_per_batch"] = round(counters["rows_dispatched"] / batches, 2) if batches else 0.0
        answer["batchers"] = await state.status_board.read_all()
        return answer

    @app.get("/v1/admin/policy", dependencies=[Depends(requires(Scope.ADMIN))])
    async def get_policy(request: Request) -> dict[str, Any]:
        """The flush-policy parameters every batcher uses now, their defaults, recent changes."""
        tuning = api_state(request).tuning
        return {"params": await tuning.values(), "defaults": tuning.defaults, "history": await tuning.history()}

    @app.patch("/v1/admin/policy", dependencies=[Depends(requires(Scope.ADMIN))])
    async def change_policy(request: Request) -> dict[str, Any]:
        """Change flush-policy parameters of every running batcher (applied within ~1 s)."""
        document = parse_json(await read_body(request, 64 * 1024))
        if not isinstance(document, dict):
            raise ApiError(422, "invalid_request", 'body must be a JSON object like {"max_wait_ms": 100}')
        actor = request.headers.get("x-brimful-actor", request.client.host if request.client else "")
        try:
            return await api_state(request).tuning.update(document, actor=actor)
        except TuningError as error:
            raise ApiError(422, "invalid_policy", str(error)) from error

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> Response:
        """The API's Prometheus metrics: summed over every worker when there are several."""
        if os.environ.get(MULTIPROCESS_DIR_ENV):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        """Readiness: 200 only when the broker, Redis and the model are all reachable."""
        state = api_state(request)

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
