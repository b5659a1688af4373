"""Whether this API process is alive and ready, and what it measures (Prometheus)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess

from brimful.api.state import api_state
from brimful.core.metrics import MULTIPROCESS_DIR_ENV

router = APIRouter(tags=["health"])

READY_CHECK_TIMEOUT_S = 2.0
# The checks /readyz needs to pass; "model" (answering now) is reported beside them.
READINESS_REQUIRES = ("broker", "redis", "model_signature")


@router.get("/metrics", include_in_schema=False)
async def prometheus_metrics() -> Response:
    """The API's Prometheus metrics: summed over every worker when there are several."""
    if os.environ.get(MULTIPROCESS_DIR_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # untyped in prometheus_client
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Readiness: 200 when this API can accept work durably: the broker and Redis answer
    and it knows every served model's signature (read once, to validate inputs). Whether
    the models answer *now* is reported, not required: while it is away, tasks queue in the broker,
    as designed, instead of every API replica leaving its load balancer."""
    state = api_state(request)

    async def broker() -> bool:
        if not state.producer_started:
            return False
        await state.producer.client.fetch_all_metadata()
        return True

    async def redis() -> bool:
        return bool(await state.redis.ping())

    async def model() -> bool:
        if state.catalogue is None:
            return False
        return all(await asyncio.gather(*(model.is_ready() for model in state.models)))

    async def check(probe: Callable[[], Awaitable[Any]]) -> bool:
        try:
            return bool(await asyncio.wait_for(probe(), timeout=READY_CHECK_TIMEOUT_S))
        except Exception:
            return False

    broker_ok, redis_ok, model_ok = await asyncio.gather(check(broker), check(redis), check(model))
    signature_known = state.catalogue is not None
    ready = broker_ok and redis_ok and signature_known
    checks = {"broker": broker_ok, "redis": redis_ok, "model_signature": signature_known, "model": model_ok}
    return JSONResponse(
        {"ready": ready, "checks": checks, "required": list(READINESS_REQUIRES)}, status_code=200 if ready else 503
    )
