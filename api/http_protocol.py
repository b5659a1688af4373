"""uvicorn's HTTP protocol with a deadline on what uvicorn leaves unbounded: a new
connection's first request, and each request's headers.

uvicorn times out a kept-alive connection between requests, but not one that connects and
sends nothing, nor one that sends its headers a byte at a time: each would hold a socket
and its buffers for ever. Here both get ``api_read_timeout_s`` from the moment the
connection opens (or the next request's first byte arrives); a request whose headers
are still incomplete then gets 408 and the connection closes. The body's own deadline is
the handler's (``api.request_body.read_body``), which can answer it in JSON; a connection
answered before its body was all read is closed, so the rest cannot trickle in unbounded.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from brimful.api.errors import error_body
from brimful.api.json_answer import JsonAnswer
from brimful.core.settings import get_settings


def _timeout_answer(timeout_s: float) -> bytes:
    body = JsonAnswer(
        error_body("request_timeout", f"the request's headers did not arrive within {timeout_s:g} s")
    ).body
    return (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(body)).encode("ascii") + b"\r\n\r\n" + bytes(body)
    )


class ReadDeadlineProtocol(HttpToolsProtocol):
    """The httptools protocol, closing a connection whose request head is not in within
    the read timeout (``BRIMFUL_API_READ_TIMEOUT_S``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_timeout_s = get_settings().api_read_timeout_s
        self._deadline: asyncio.TimerHandle | None = None
        self._head_started = False  # some of a request's head has arrived, not all of it

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_started = True
        if self._deadline is None:  # a new connection's deadline runs from when it opened
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._head_started = False
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        # An answer sent before the body was all read (a refusal, a timeout): the rest of
        # the body would still be read as it trickles in, with no deadline, so close.
        unread = self.cycle is not None and self.cycle.more_body
        super().on_response_complete()
        if unread and not self.transport.is_closing():
            self.transport.close()

    def _arm(self) -> None:
        self._deadline = self.loop.call_later(self.read_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._head_started:
            self.transport.write(_timeout_answer(self.read_timeout_s))
        self.transport.close()
