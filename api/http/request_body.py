"""Reading a request's body: bounded in size and time, then decoded as JSON with a precise 4xx."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from starlette.requests import ClientDisconnect

from brimful.api.http.answers import ApiError
from brimful.core.number_text import whole_number


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
        raise ApiError(
            408, "request_timeout", f"the body did not arrive within {timeout_s:g} s ({len(body)} bytes came)"
        ) from error
    except ClientDisconnect as error:
        raise ApiError(
            499, "client_closed_request", "the client closed the connection before sending the body"
        ) from error
    return bytes(body)


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
