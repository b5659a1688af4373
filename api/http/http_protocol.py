"""uvicorn's HTTP protocol with bounds on what uvicorn leaves unbounded: how long a new
connection's first request and each request's headers may take, and how large a
request's head may grow.

uvicorn times out a kept-alive connection between requests, but not one that connects and
sends nothing, nor one that sends its headers a byte at a time: each would hold a socket
and its buffers for ever. Here both get ``api_read_timeout_s`` from the moment the
connection opens (or the next request's first byte arrives); a request whose headers
are still incomplete then gets 408 and the connection closes (after reading and dropping
what the client still sends for a moment, so that it sees the answer). A head (request
line and headers) over ``MAX_HEAD_BYTES`` gets 431 the same way: the parser would
otherwise keep every byte of it until the deadline.

The body's own deadline is the handler's (``read_body`` in ``api/http/bodies.py``), which can
answer it in JSON; a connection answered before its body was all read ends as a refused
one does (what still comes is dropped for a moment, then the connection is dropped), so
the rest cannot trickle in unbounded and the client still reads its answer. A small rest
(a declared length up to ``DRAIN_MAX_BYTES``) is read and dropped instead, for at most
``LINGER_S``, and the connection kept: a client that answered early (a 400 for its query,
a 404 for its path) sends its next request on the same connection, and would meet a
connection the server had ended as the request left.

``api_max_connections`` bounds one worker's requests under way (long-polls included) and
its open connections. Connections that send nothing cannot lock clients out: a connection
that opens past the bound closes the longest-idle one first (no request under way, none
begun), and only when none is idle does a new request get 503 ``too_many_connections``
with ``Retry-After``, in the API's JSON error shape (uvicorn's own ``limit_concurrency``
answers a plain-text 503 no client of this API can parse, and counts idle connections).
The probes (``/healthz``, ``/readyz``) are never refused for the bound: a kubelet that
cannot reach them would restart a worker that is only busy.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httptools
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from brimful.api.http.bodies import JsonAnswer, error_body, retry_after
from brimful.api.http.direct_lane import DirectCycle, DirectLane
from brimful.core import metrics
from brimful.core.settings import get_settings

# Far above any real client's head (API keys, trace context and an Idempotency-Key fit in
# a few hundred bytes); common servers refuse past 8-16 KiB.
MAX_HEAD_BYTES = 64 * 1024
# After refusing a request, how long the connection keeps reading (and dropping) what the
# client still sends, so that closing does not reset it before it reads the answer.
LINGER_S = 2.0
# The most of a body answered early that is still read (and dropped) to keep the connection.
DRAIN_MAX_BYTES = 64 * 1024
# Answered whatever the load: the probes.
PROBE_PATHS = frozenset({b"/healthz", b"/readyz"})
# The methods of the direct lane's two routes (api/http/direct_lane.py).
_DIRECT_METHODS = frozenset({b"POST", b"GET"})


def _closing_answer(status_line: bytes, code: str, message: str) -> bytes:
    body = bytes(JsonAnswer(error_body(int(status_line.split()[1]), code, message)).body)
    return (
        status_line + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(body)).encode("ascii") + b"\r\n\r\n" + body
    )


def _too_many_connections(limit: int) -> bytes:
    return bytes(
        JsonAnswer(
            error_body(
                503,
                "too_many_connections",
                f"this API worker holds its limit of {limit} connections or requests at once; retry shortly",
            )
        ).body
    )


def _direct_lane(app: object) -> DirectLane | None:
    """The app's own answers to the two task routes, when it offers them (``create_app``'s
    app does), under whatever uvicorn wraps around it (proxy headers, message logging)."""
    for _ in range(8):
        lane = getattr(app, "direct_lane", None)
        if isinstance(lane, DirectLane):
            return lane
        app = getattr(app, "app", None)
    return None


class BoundedHttpProtocol(HttpToolsProtocol):
    """The httptools protocol, refusing a request whose head is not all in within the
    read timeout (``BRIMFUL_API_READ_TIMEOUT_S``: 408) or grows past ``MAX_HEAD_BYTES``
    (431), closing a connection that sends nothing for that long, shedding the longest
    idle connection past ``BRIMFUL_API_MAX_CONNECTIONS``, and answering 503 in JSON when
    requests under way reach it (probes excepted)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = get_settings()
        self.read_timeout_s = settings.api_read_timeout_s
        self.max_connections = settings.api_max_connections
        self._deadline: asyncio.TimerHandle | None = None
        self._head_started = False  # some of a request's head has arrived, not all of it
        self._in_body = False
        self._head_bytes = 0  # received since the last head ended, outside bodies
        self._refused = False
        self._draining: asyncio.TimerHandle | None = None  # dropping the rest of an answered body
        self._idle_since = 0.0  # when it last had no request under way (loop time)
        self.direct_lane = _direct_lane(self.app)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._idle_since = self.loop.time()
        self._arm()
        if len(self.connections) > self.max_connections:
            self._shed_longest_idle()

    @property
    def idle(self) -> bool:
        """Open with no request under way and none begun (a keep-alive between requests,
        or a socket that never sent anything)."""
        return (
            not self._head_started
            and not self._in_body
            and not self._refused
            and (self.cycle is None or self.cycle.response_complete)
            and not self.transport.is_closing()
        )

    def _shed_longest_idle(self) -> None:
        """Close the connection idle the longest, if one is: its client loses nothing (it
        opens another when it has a request), and the new one gets its place."""
        idle = [c for c in self.connections if c is not self and isinstance(c, BoundedHttpProtocol) and c.idle]
        if idle:
            min(idle, key=lambda connection: connection._idle_since).transport.close()
            metrics.CONNECTIONS_SHED.inc()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._stop_draining()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # lingering after a refusal: dropped
        if not self._in_body:
            self._head_bytes += len(data)
            if self._deadline is None:  # a next request's head starts its own clock
                self._arm()
        super().data_received(data)
        if self._head_started and self._head_bytes > MAX_HEAD_BYTES:
            self._refuse(
                b"HTTP/1.1 431 Request Header Fields Too Large",
                "headers_too_large",
                f"the request line and headers exceed {MAX_HEAD_BYTES} bytes",
            )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_started = True

    def on_headers_complete(self) -> None:
        self._disarm()
        self._head_started = False
        self._in_body = True
        self._head_bytes = 0
        # Requests under way in this worker (long-polls included), or connections still
        # past the bound with none idle to shed; never a probe.
        over = len(self.tasks) >= self.max_connections or (
            # A connection shed a moment ago is still in the set until its loss is heard.
            len(self.connections) > self.max_connections
            and sum(not c.transport.is_closing() for c in self.connections) > self.max_connections
        )
        if over and self.url.split(b"?", 1)[0] not in PROBE_PATHS:
            app, self.app = self.app, self._refuse_overloaded
            try:
                super().on_headers_complete()  # runs the refusal as this request's app
            finally:
                self.app = app
            return
        if self.direct_lane is None or not self._take_directly(self.direct_lane):
            super().on_headers_complete()

    def _take_directly(self, lane: DirectLane) -> bool:
        """Start this request on the direct lane (``api/http/direct_lane.py``) if it takes it."""
        if self.root_path or self.expect_100_continue or self.parser.should_upgrade():
            return False
        if self.cycle is not None and not self.cycle.response_complete:
            return False  # pipelined behind a request under way: uvicorn queues it
        method = self.parser.get_method()
        if method not in _DIRECT_METHODS:
            return False  # no URL parsed twice for the routes the lane never takes
        try:
            url = httptools.parse_url(self.url)
        except httptools.HttpParserInvalidURLError:
            return False  # uvicorn's to answer, as it answers any other
        route = lane.route(method, url.path, self.headers)
        if route is None:
            return False
        keep_alive = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
        cycle = DirectCycle(
            self.transport,
            self.flow.resume_reading,
            self.server_state.default_headers,
            keep_alive,
            self.on_response_complete,
            route.declared_length,
        )
        # uvicorn's callbacks (body, end of message, connection lost, shutdown) feed
        # whatever cycle the protocol holds; this one has the attributes they use.
        self.cycle = cycle  # type: ignore[assignment]
        task = self.loop.create_task(lane.answer(route, cycle, url.query or b"", self.headers, self.scheme or "http"))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)
        return True

    async def _refuse_overloaded(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app a request past the limit gets: 503, and the connection closed."""
        metrics.REFUSALS.labels("too_many_connections").inc()
        body = _too_many_connections(self.max_connections)
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode("ascii")),
                    (b"retry-after", retry_after(1).encode("ascii")),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def on_message_complete(self) -> None:
        self._in_body = False
        super().on_message_complete()
        if self._draining is not None:  # the rest of an answered body came: the connection goes on
            self._stop_draining()
            if self._deadline is None:  # idle from here: the next head's clock (uvicorn's
                self._arm()  # keep-alive timer ended when the body's bytes came)

    def on_response_complete(self) -> None:
        # An answer sent before the body was all read (a refusal, a timeout): the rest of
        # the body would still be read as it trickles in, with no deadline, so the
        # connection ends. Not with close(): closing a socket with unread bytes resets it,
        # and a client still sending its body then never reads the answer (a 413 became a
        # broken pipe). It lingers, dropping what comes, as a refusal does.
        # With a request pipelined behind it, the answered request's body was all read
        # (the next head came after it): ``self.cycle`` is then the next request's, whose
        # body may still be on its way, and must not end the connection.
        unread = not self.pipeline and self.cycle is not None and self.cycle.more_body
        self._idle_since = self.loop.time()
        super().on_response_complete()
        if not unread or self.transport.is_closing():
            return
        if self._declared_length() <= DRAIN_MAX_BYTES:
            self._draining = self.loop.call_later(LINGER_S, self._drain_too_slow)
        else:
            self._end_after_answer()

    def _declared_length(self) -> float:
        """The answered request's Content-Length; a chunked body counts as unbounded."""
        for name, value in self.headers:
            if name == b"content-length" and value.strip().isdigit():
                return int(value)
        return float("inf")

    def _drain_too_slow(self) -> None:
        self._draining = None
        if not self.transport.is_closing():
            self._end_after_answer()

    def _stop_draining(self) -> None:
        if self._draining is not None:
            self._draining.cancel()
            self._draining = None

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
        if not self._head_started:
            self.transport.close()  # nothing sent: nothing to answer
            return
        self._refuse(
            b"HTTP/1.1 408 Request Timeout",
            "request_timeout",
            f"the request's headers did not arrive within {self.read_timeout_s:g} s",
        )

    def _refuse(self, status_line: bytes, code: str, message: str) -> None:
        """Answer and close: send the answer, then end the connection (``_end_after_answer``)."""
        self._disarm()
        self.transport.write(_closing_answer(status_line, code, message))
        self._end_after_answer()

    def _end_after_answer(self) -> None:
        """Send our end of the stream, then drop what the client still sends for
        ``LINGER_S`` before dropping the connection."""
        self._refused = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        # abort, not close: close would wait for the answer to be read, for ever if the
        # client reads nothing.
        self.loop.call_later(LINGER_S, self.transport.abort)
