"""The bodies the API reads and writes: a request's body read within its bounds of size
and time, then decoded as JSON with a precise 4xx (``read_body``, ``parse_json``); the
answers, JSON rendered by orjson, every 4xx/5xx body as OpenAI's error object,
``{"error": {"message", "type", "param", "code"}}``.

``JsonAnswer`` renders the same compact UTF-8 document as Starlette's ``JSONResponse``
(which calls the standard library's ``json.dumps``), at about a sixteenth of its cost for a
task's answer (0.6 against 10 us on this project's 2-core machine), which every task gets.
Values are the plain ones the routes build (dicts, lists, str, int, float, bool, None); a
NaN, which Starlette would refuse, is written as null, and outputs never hold one (the
batch runner fails such a row with its reason).

``admit`` takes from a tenant's rate (``core/tenant_limits.py``) or answers 429
``rate_limited`` with Retry-After."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from aiokafka.errors import KafkaError
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse

from brimful.core import metrics
from brimful.core.model_catalogue import UnknownModelError
from brimful.core.number_text import whole_number
from brimful.core.tenant_limits import RateLimiter


class JsonAnswer(JSONResponse):
    """A JSON response rendered by orjson."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


# The header of an answer given again: a request whose Idempotency-Key an earlier one used.
REPLAYED = {"Idempotent-Replayed": "true"}

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
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param  # the request field at fault, where one is (OpenAI's ``param``)
        self.headers = headers if retry_after_s is None else {**(headers or {}), **retry_headers(retry_after_s)}


def retry_after(seconds: float) -> str:
    """``Retry-After``'s value for a wait of ``seconds``: whole seconds, as HTTP states it
    (RFC 9110), rounded up and at least 1."""
    return str(max(1, math.ceil(seconds)))


def retry_headers(seconds: float) -> dict[str, str]:
    """How long to wait before retrying, said twice: ``Retry-After`` in HTTP's whole
    seconds, and ``retry-after-ms`` in milliseconds (OpenAI's SDK and Brimful's client read
    it first), so a wait of a few milliseconds is not rounded up to a second."""
    return {"Retry-After": retry_after(seconds), "retry-after-ms": str(max(1, math.ceil(seconds * 1000)))}


def unknown_model(error: UnknownModelError) -> ApiError:
    """The one answer to a model not served here, wherever a request names one."""
    return ApiError(422, "unknown_model", str(error), param="model")


# OpenAI's error types by status: its SDK shows them as ``error.type``.
_ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
# Asked of a client that retries by itself (OpenAI's SDK retries every 409 and 5xx) where a
# retry cannot help: the answer would be the same.
NO_RETRY = {"x-should-retry": "false"}


def error_type(status: int) -> str:
    """OpenAI's ``type`` for an error answered with ``status``."""
    return _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, code: str, message: str, param: str | None = None) -> dict[str, dict[str, str | None]]:
    """The one shape of an error: OpenAI's error object (``message``, ``type``, ``param``,
    ``code``), with the code a program can branch on."""
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


def error_of(error: ApiError) -> dict[str, dict[str, str | None]]:
    """``error``'s body."""
    return error_body(error.status, error.code, error.message, error.param)


def api_error_answer(error: Exception) -> JsonAnswer:
    assert isinstance(error, ApiError)
    if error.status in REFUSAL_STATUSES:
        metrics.REFUSALS.labels(error.code).inc()
    return JsonAnswer(error_of(error), status_code=error.status, headers=error.headers)


def http_error_answer(error: Exception) -> JsonAnswer:
    assert isinstance(error, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
    return JsonAnswer(
        error_body(error.status_code, code, str(error.detail)), status_code=error.status_code, headers=error.headers
    )


def dependency_error_answer(error: Exception) -> JsonAnswer:
    """Redis or the broker failed mid-request: the client may retry, nothing was lost."""
    metrics.REFUSALS.labels("dependency_unavailable").inc()
    return JsonAnswer(
        error_body(
            503, "dependency_unavailable", f"a backing service is unreachable ({type(error).__name__}); retry shortly"
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
    return JsonAnswer(error_body(422, "invalid_request", problems or "invalid request"), status_code=422)


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


async def admit(limiter: RateLimiter, tenant: str, count: int = 1) -> None:
    """Take ``count`` units of the tenant's rate, or answer 429 ``rate_limited`` with Retry-After."""
    verdict = await limiter.take(tenant, count)
    if not verdict.allowed:
        raise ApiError(
            429,
            "rate_limited",
            f"over the rate of {limiter.rate_per_s:g} {limiter.unit}/s (burst {limiter.burst}); "
            f"retry in {verdict.retry_after_s} s",
            retry_after_s=verdict.retry_after_s,
        )


# --- from api/http/bodies.py ---
# Reading a request's body: bounded in size and time, then decoded as JSON with a precise 4xx.
async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The whole body, or 413 as soon as it passes ``limit`` bytes (declared or streamed),
    or 408 if it has not all arrived within ``timeout_s``. A client that hangs up midway
    gets 499 (it hears nothing; the answer is only counted), not a 500."""
    return await read_stream(request.headers.get("content-length"), request.stream(), limit, timeout_s)


async def read_stream(declared: str | None, chunks: AsyncIterator[bytes], limit: int, timeout_s: float) -> bytes:
    """``read_body`` for a body that comes as ``chunks`` with ``declared`` as its
    Content-Length: the same bounds and answers, whichever lane reads it. ``chunks``
    raises ``ClientDisconnect`` when the client hangs up."""
    check_declared(declared, limit)
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in chunks:
                body += chunk
                check_length(len(body), limit)
    except TimeoutError as error:
        raise too_slow(f"the body did not arrive within {timeout_s:g} s ({len(body)} bytes came)") from error
    except ClientDisconnect as error:
        raise client_closed("before sending the body") from error
    return bytes(body)


def too_slow(message: str) -> ApiError:
    """408 ``request_timeout``: a body that did not arrive within its time."""
    return ApiError(408, "request_timeout", message)


def client_closed(when: str) -> ApiError:
    """499 ``client_closed_request``: the client hung up ``when`` (it hears nothing; the
    answer is only counted), not a 500."""
    return ApiError(499, "client_closed_request", f"the client closed the connection {when}")


def check_declared(declared: str | None, limit: int) -> None:
    """413 for a body whose Content-Length is past ``limit``, before a byte of it is read."""
    if declared is not None and whole_number(declared, limit + 1, 2**62) is not None:
        raise ApiError(413, "body_too_large", f"body of {declared} bytes exceeds the limit of {limit} bytes")


def check_length(length: int, limit: int) -> None:
    """413 for a body that has passed ``limit`` bytes as it arrived."""
    if length > limit:
        raise ApiError(413, "body_too_large", f"body exceeds the limit of {limit} bytes")


def parse_json(body: bytes) -> Any:
    """Decode the body as JSON or raise a 400 saying where it breaks."""
    try:
        return json.loads(body)
    except UnicodeDecodeError as error:
        raise ApiError(400, "invalid_json", f"body is not UTF-8: {error.reason} at byte {error.start}") from error
    except json.JSONDecodeError as error:
        raise ApiError(
            400, "invalid_json", f"body is not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})"
        ) from error
    except ValueError as error:  # an integer of thousands of digits: Python refuses to convert it
        raise ApiError(400, "invalid_json", f"body holds a number Brimful will not read: {error}"[:300]) from error
    except RecursionError as error:
        raise ApiError(400, "invalid_json", "body nests arrays or objects too deeply") from error
