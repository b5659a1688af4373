"""The direct lane: ``POST /v1/tasks`` and ``GET /v1/tasks/{task_id}`` answered inside the
HTTP protocol, with no ASGI scope, no Starlette request or response and no ASGI messages.

Through ASGI every task pays FastAPI's stack (middleware, the route table, dependency
resolution) and ASGI itself: the scope, the wrappers around the app (counting answers,
the browser guard), a Starlette ``Request`` and its body stream, and the answer sent as
two messages through uvicorn's cycle. Here ``BoundedHttpProtocol``
hands the request to ``DirectLane`` once its head is parsed; the same handler code runs
(``accept_task`` and ``read_task``, after the same ``authenticate`` and the same browser
guard), and the answer goes out in one write. Every check stays where it is: the limits,
auth, idempotency and validation are the handlers', not this module's.

A request stays on the ASGI lane when this lane would have to do more than it does: a
``%``-escaped path, ``Expect: 100-continue``, a request pipelined behind one still under
way, an ``Origin`` header (what CORS and the browser guard's origin rule answer), tracing
on, or a ``root_path``. ``BRIMFUL_API_DIRECT_LANE=false`` turns the lane off (to compare).
"""

from __future__ import annotations

import asyncio
import http
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from starlette.requests import ClientDisconnect

from brimful.api.http.bodies import JsonAnswer, answer_for, check_declared, check_length, read_stream
from brimful.api.http.guards import BrowserGuard, authenticate
from brimful.api.state import ApiState
from brimful.api.tasks.task_routes import TASKS_PATH, accept_task, hot_route, read_task
from brimful.core import metrics
from brimful.core.api_keys import Scope

log = logging.getLogger("brimful.api")

# The headers this lane reads; the first of each is the one read, as Starlette reads it.
_READ = frozenset({b"authorization", b"idempotency-key", b"content-length", b"origin"})
_SERVER_ERROR = (
    [(b"content-length", b"21"), (b"content-type", b"text/plain; charset=utf-8")],
    b"Internal Server Error",
)


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        phrase = b""  # 499 and the like: the code alone, as uvicorn writes it
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


_STATUS_LINES = {status: _status_line(status) for status in range(100, 600)}


class DirectCycle:
    """One request on the direct lane. uvicorn's protocol feeds it as it feeds its own
    request cycle (``body``, ``more_body``, ``message_event``; ``disconnected`` when the
    client goes) and reads it the same way (``response_complete``, ``keep_alive``)."""

    def __init__(
        self,
        transport: asyncio.Transport,
        resume_reading: Callable[[], None],
        default_headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
        on_response: Callable[[], None],
        declared_length: str | None,
    ) -> None:
        self.transport = transport
        self.resume_reading = resume_reading
        self.default_headers = default_headers
        self.keep_alive = keep_alive
        self.on_response = on_response
        self.declared_length = declared_length
        self.body = bytearray()
        self.more_body = True
        self.message_event = asyncio.Event()
        self.disconnected = False
        self.response_complete = False

    async def read_body(self, limit: int, timeout_s: float) -> bytes:
        """The whole body within ``limit`` bytes and ``timeout_s``: ``read_body``'s answers."""
        if self.more_body:
            return await read_stream(self.declared_length, self._chunks(), limit, timeout_s)
        # All of it came with the head, as a task's small body does: no deadline to arm.
        check_declared(self.declared_length, limit)
        check_length(len(self.body), limit)
        body, self.body = bytes(self.body), bytearray()
        return body

    async def _chunks(self) -> AsyncIterator[bytes]:
        while True:
            if self.body:
                chunk, self.body = bytes(self.body), bytearray()
                yield chunk
            if not self.more_body:
                return
            if self.disconnected:
                raise ClientDisconnect()
            self.message_event.clear()
            self.resume_reading()  # the protocol pauses reading past its high-water mark
            await self.message_event.wait()

    def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Write the answer in one piece (nothing, if the client has gone), then let the
        protocol go on to the connection's next request."""
        if self.response_complete:
            return
        self.response_complete = True
        self.message_event.set()
        if self.disconnected:
            return  # as uvicorn does: nothing to write to, and the connection is ending
        parts = [_STATUS_LINES[status]]
        for name, value in self.default_headers:
            parts += (name, b": ", value, b"\r\n")
        for name, value in headers:
            parts += (name, b": ", value, b"\r\n")
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        parts += (b"\r\n", body)
        self.transport.write(b"".join(parts))
        if not self.keep_alive:
            self.transport.close()
        self.on_response()


Handler = Callable[[ApiState, DirectCycle, dict[bytes, bytes], bytes, str], Awaitable[JsonAnswer]]


async def _submit(
    state: ApiState, cycle: DirectCycle, headers: dict[bytes, bytes], query: bytes, _task_id: str
) -> JsonAnswer:
    principal = await authenticate(state, _text(headers.get(b"authorization")), Scope.SUBMIT)
    return await accept_task(state, principal, query, _text(headers.get(b"idempotency-key")), cycle.read_body)


async def _read(
    state: ApiState, cycle: DirectCycle, headers: dict[bytes, bytes], query: bytes, task_id: str
) -> JsonAnswer:
    principal = await authenticate(state, _text(headers.get(b"authorization")), Scope.READ)
    return JsonAnswer(await read_task(state, principal, task_id, query))


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


@dataclass(frozen=True)
class DirectRoute:
    """A request the direct lane takes: its handler, and what that reads of the head."""

    handler: Handler
    template: str
    verb: str
    target: str
    task_id: str
    state: ApiState
    headers: dict[bytes, bytes]

    @property
    def declared_length(self) -> str | None:
        return _text(self.headers.get(b"content-length"))


class DirectLane:
    """Routes a parsed request head to the direct lane, or declines (None): the ASGI app
    answers it. ``BoundedHttpProtocol`` asks (``route``), begins the request's
    ``DirectCycle`` and runs ``answer`` on it."""

    def __init__(self, app: FastAPI, guard: BrowserGuard) -> None:
        """``app``: the FastAPI app whose state (``app.state.brimful``) the handlers use;
        ``guard``: the browser guard the ASGI lane runs, run here on the same headers."""
        self._app = app
        self._guard = guard
        self._counted: dict[tuple[str, int], Any] = {}

    def route(self, method: bytes, path: bytes, head: list[tuple[bytes, bytes]]) -> DirectRoute | None:
        """The route this request takes on the direct lane; None to leave it to ASGI."""
        if not path.isascii():
            return None  # uvicorn's decoding, then FastAPI's routes
        verb, target = method.decode("ascii"), path.decode("ascii")
        route = hot_route(verb, target)
        if route is None:
            return None
        template, task_id = route
        state: ApiState | None = getattr(self._app.state, "brimful", None)
        if state is None or state.tracing is not None or "%" in target:
            return None
        headers: dict[bytes, bytes] = {}
        for name, value in head:
            if name in _READ and name not in headers:
                headers[name] = value
        if b"origin" in headers:
            return None
        handler: Handler = _submit if template == TASKS_PATH else _read
        return DirectRoute(handler, template, verb, target, task_id, state, headers)

    async def answer(
        self, route: DirectRoute, cycle: DirectCycle, query: bytes, head: list[tuple[bytes, bytes]], scheme: str
    ) -> None:
        """Answer the request ``route`` took through ``cycle`` (the caller runs this as a task)."""
        refusal = self._guard.refusal_of(route.verb, route.target, head, scheme)
        if refusal is not None:
            self._send(cycle, "unmatched", refusal)  # as the ASGI lane counts the guard's refusals
            return
        try:
            answer = await route.handler(route.state, cycle, route.headers, query, route.task_id)
        except Exception as error:
            known = answer_for(error)
            if known is None:
                log.exception("unhandled error", extra={"path": route.template})
                self._count(route.template, 500)
                cycle.answer(500, *_SERVER_ERROR)
                return
            answer = known
        self._send(cycle, route.template, answer)

    def _send(self, cycle: DirectCycle, template: str, answer: JsonAnswer) -> None:
        self._count(template, answer.status_code)
        cycle.answer(answer.status_code, answer.raw_headers, bytes(answer.body))

    def _count(self, template: str, status: int) -> None:
        """``brimful_http_responses_total``, as ``ResponseCounter`` counts the ASGI lane."""
        counter = self._counted.get((template, status))
        if counter is None:
            counter = self._counted[template, status] = metrics.HTTP_RESPONSES.labels(template, str(status))
        counter.inc()
