"""The API's answers: JSON rendered by orjson, and every 4xx/5xx body as
``{"error": {"code": ..., "message": ...}}``.

``JsonAnswer`` renders the same compact UTF-8 document as Starlette's ``JSONResponse``
(which calls the standard library's ``json.dumps``), at about a sixteenth of its cost for a
task's answer (0.6 against 10 us on this project's 2-core machine), which every task gets.
Values are the plain ones the routes build (dicts, lists, str, int, float, bool, None); a
NaN, which Starlette would refuse, is written as null, and outputs never hold one (the
batch runner fails such a row with its reason)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiokafka.errors import KafkaError
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from brimful.core import metrics
from brimful.core.model_catalogue import UnknownModelError


class JsonAnswer(JSONResponse):
    """A JSON response rendered by orjson."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


# Answers that refuse work for load or size (not for a bad request): counted by reason.
REFUSAL_STATUSES = frozenset({413, 429, 503})


class ApiError(Exception):
    """An error answered to the client, with a code a program can branch on."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        headers: dict[str, str] | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = (
            headers if retry_after_s is None else {**(headers or {}), "Retry-After": retry_after(retry_after_s)}
        )


def retry_after(seconds: float) -> str:
    """``Retry-After``'s value for a wait of ``seconds``: whole seconds, as HTTP states it
    (RFC 9110), rounded up and at least 1."""
    return str(max(1, math.ceil(seconds)))


def unknown_model(error: UnknownModelError) -> ApiError:
    """The one answer to a model not served here, wherever a request names one."""
    return ApiError(422, "unknown_model", str(error))


def error_body(code: str, message: str) -> dict[str, dict[str, str]]:
    return {"error": {"code": code, "message": message}}


def api_error_answer(error: Exception) -> JsonAnswer:
    assert isinstance(error, ApiError)
    if error.status in REFUSAL_STATUSES:
        metrics.REFUSALS.labels(error.code).inc()
    return JsonAnswer(error_body(error.code, error.message), status_code=error.status, headers=error.headers)


def http_error_answer(error: Exception) -> JsonAnswer:
    assert isinstance(error, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
    return JsonAnswer(error_body(code, str(error.detail)), status_code=error.status_code, headers=error.headers)


def dependency_error_answer(error: Exception) -> JsonAnswer:
    """Redis or the broker failed mid-request: the client may retry, nothing was lost."""
    metrics.REFUSALS.labels("dependency_unavailable").inc()
    return JsonAnswer(
        error_body(
            "dependency_unavailable", f"a backing service is unreachable ({type(error).__name__}); retry shortly"
        ),
        status_code=503,
        headers={"Retry-After": retry_after(1)},
    )


def validation_error_answer(error: Exception) -> JsonAnswer:
    assert isinstance(error, RequestValidationError)
    problems = "; ".join(
        f"{'.'.join(str(part) for part in issue.get('loc', ()))}: {issue.get('msg', 'invalid')}"
        for issue in error.errors()
    )
    return JsonAnswer(error_body("invalid_request", problems or "invalid request"), status_code=422)


# Which error gets which answer: the one table behind FastAPI's handlers and the lanes past it.
ANSWERS: dict[type[Exception], Callable[[Exception], JsonAnswer]] = {
    ApiError: api_error_answer,
    StarletteHTTPException: http_error_answer,
    RequestValidationError: validation_error_answer,
    RedisError: dependency_error_answer,
    KafkaError: dependency_error_answer,
}


def answer_for(error: Exception) -> JsonAnswer | None:
    """The answer to ``error``, by its class or its nearest base as Starlette picks a
    handler; None for an error no handler names (a 500)."""
    for cls in type(error).__mro__:
        if cls in ANSWERS:
            return ANSWERS[cls](error)
    return None


async def answer_error(request: Request, error: Exception) -> JsonAnswer:
    """FastAPI's exception handler for every class in ``ANSWERS``."""
    answer = answer_for(error)
    assert answer is not None, "installed only for the classes ANSWERS names"
    return answer


Handler = Callable[[Request, Exception], Awaitable[JsonAnswer]]
HANDLERS: dict[type[Exception], Handler] = dict.fromkeys(ANSWERS, answer_error)
