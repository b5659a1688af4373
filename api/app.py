"""The HTTP front door: ``create_app(settings)`` assembles the routes, the error answers
and the state the API holds while it runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

from brimful.api.admin import dlq_routes, operator_routes
from brimful.api.http import health_routes
from brimful.api.http.bodies import HANDLERS
from brimful.api.http.direct_lane import DirectLane
from brimful.api.http.guards import BrowserGuard
from brimful.api.http.response_metrics import ResponseCounter
from brimful.api.jobs import job_routes
from brimful.api.jobs.job_driver import BatchJobs
from brimful.api.openai import embedding_routes, file_routes, model_routes
from brimful.api.openai.storage_sweep import StorageSweep
from brimful.api.openapi import document
from brimful.api.state import ApiState
from brimful.api.tasks import task_routes
from brimful.api.webhooks import webhook_routes
from brimful.api.webhooks.webhook_sender import WebhookSender
from brimful.core.heap import freeze_startup_heap
from brimful.core.logs import configure_logging
from brimful.core.settings import Settings, get_settings


def app_from_environment() -> ASGIApp:
    """The app for one of several API workers: settings and logging from the environment."""
    configure_logging()
    return create_app(get_settings())


def create_app(settings: Settings) -> ASGIApp:
    """Build the application for these settings: FastAPI behind the browser guard
    (and CORS, where origins are configured), every answer counted by route and status;
    with the direct lane for those two routes unless ``api_direct_lane`` is off."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = ApiState(settings)
        app.state.brimful = state
        await state.start()
        state.run_in_background(BatchJobs(state, state.batch_records).run(), "batch-jobs")
        state.run_in_background(WebhookSender(settings, state.webhooks, state.webhook_hosts).run(), "webhook-sender")
        state.run_in_background(StorageSweep(state, settings.file_sweep_interval_s).run(), "storage-sweep")
        freeze_startup_heap()
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
    document.install(app, settings, lambda: getattr(getattr(app.state, "brimful", None), "catalogue", None))
    for routes in (
        task_routes,
        model_routes,
        embedding_routes,
        file_routes,
        job_routes,
        operator_routes,
        dlq_routes,
        health_routes,
        webhook_routes,
    ):
        app.include_router(routes.router)
    for error, handler in HANDLERS.items():
        app.add_exception_handler(error, handler)
    guard = BrowserGuard(app, settings, upload_paths=frozenset({file_routes.FILES_PATH}))
    served: ASGIApp = guard
    origins = settings.cors_origins
    if origins:
        served = CORSMiddleware(
            served,
            allow_origins=origins,
            allow_methods=["GET", "POST", "PATCH", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key", "X-Brimful-Actor"],
        )
    return ServedApp(served, DirectLane(app, guard) if settings.api_direct_lane else None)


class ServedApp(ResponseCounter):
    """What uvicorn serves: the ASGI app, every answer counted, and the ``direct_lane``
    that the HTTP protocol (``api/http/http_protocol.py``) answers the two task routes with."""

    def __init__(self, app: ASGIApp, direct_lane: DirectLane | None) -> None:
        super().__init__(app)
        self.direct_lane = direct_lane
