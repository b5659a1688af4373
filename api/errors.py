"""Error responses: every 4xx/5xx body is ``{"error": {"code": ..., "message": ...}}``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiokafka.errors import KafkaError
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from brimful.api.json_answer import JsonAnswer
from brimful.core import metrics
from brimful.core.model_catalogue import UnknownModelError

# Answers that refuse work for load or size (not for a bad request): counted by reason.
REFUSAL_STATUSES = frozenset({413, 429, 503})


class ApiError(Exception):
    """An error answered to the client, with a code a program can branch on."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def unknown_model(error: UnknownModelError) -> ApiError:
    """The one answer to a model not served here, wherever a request names one."""
    return ApiError(422, "unknown_model", str(error))


def error_body(code: str, message: str) -> dict[str, dict[str, str]]:
    return {"error": {"code": code, "message": message}}


async def api_error_handler(request: Request, error: Exception) -> JsonAnswer:
    assert isinstance(error, ApiError)
    if error.status in REFUSAL_STATUSES:
        metrics.REFUSALS.labels(error.code).inc()
    return JsonAnswer(error_body(error.code, error.message), status_code=error.status, headers=error.headers)


async def http_error_handler(request: Request, error: Exception) -> JsonAnswer:
    assert isinstance(error, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
    return JsonAnswer(error_body(code, str(error.detail)), status_code=error.status_code, headers=error.headers)


async def dependency_error_handler(request: Request, error: Exception) -> JsonAnswer:
    """Redis or the broker failed mid-request: the client may retry, nothing was lost."""
    metrics.REFUSALS.labels("dependency_unavailable").inc()
    return JsonAnswer(
        error_body(
            "dependency_unavailable", f"a backing service is unreachable ({type(error).__name__}); retry shortly"
        ),
        status_code=503,
        headers={"Retry-After": "1"},
    )


async def validation_error_handler(request: Request, error: Exception) -> JsonAnswer:
    assert isinstance(error, RequestValidationError)
    problems = "; ".join(
        f"{'.'.join(str(part) for part in issue.get('loc', ()))}: {issue.get('msg', 'invalid')}"
        for issue in error.errors()
    )
    return JsonAnswer(error_body("invalid_request", problems or "invalid request"), status_code=422)


Handler = Callable[[Request, Exception], Awaitable[JsonAnswer]]

# Which error gets which answer: installed in FastAPI, and used by the fast lane.
HANDLERS: dict[type[Exception], Handler] = {
    ApiError: api_error_handler,
    StarletteHTTPException: http_error_handler,
    RequestValidationError: validation_error_handler,
    RedisError: dependency_error_handler,
    KafkaError: dependency_error_handler,
}


def handler_for(error: Exception) -> Handler | None:
    """The handler for ``error``'s class or its nearest base, as Starlette picks it."""
    for cls in type(error).__mro__:
        if cls in HANDLERS:
            return HANDLERS[cls]
    return None
