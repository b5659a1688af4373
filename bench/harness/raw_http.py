"""A minimal HTTP/1.1 client for the load generator: keep-alive connections on
``asyncio.Protocol``, one request at a time on each, bodies framed by Content-Length or
chunked.

The load generator shares the machine with what it measures, so every microsecond it
spends is taken from Brimful. A general client (aiohttp) costs a few hundred
microseconds of CPU a request; this one does only what the benchmark needs: it writes a
request it formatted itself, reads the status line and Content-Length, and hands back
the body (Brimful's API frames it by Content-Length; Ray Serve answers chunked). Anything
else (1xx answers, trailers that matter, TLS) is refused with an error naming it, not
handled half-way.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import NamedTuple, cast
from urllib.parse import urlsplit

_HEADER_END = b"\r\n\r\n"
MAX_HEADER_BYTES = 64 * 1024  # an answer whose headers run past this is refused, not buffered
# A connection idle longer than this is closed, not reused: a server closes idle keep-alive
# connections after a timeout of its own (uvicorn's is 5 s), and a request sent as it does
# is lost to a reset. Below every common server's timeout.
MAX_IDLE_S = 2.0


class HttpError(Exception):
    """The server's answer could not be read as this client reads answers."""


class Answer(NamedTuple):
    """An answer as this client reads it: status, body, and the seconds a ``Retry-After``
    header asked for (None: none, or not a number of seconds)."""

    status: int
    body: bytes
    retry_after_s: float | None


class _Connection(asyncio.Protocol):
    """One keep-alive connection with at most one request out on it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reusable = True
        self.idle_since = 0.0  # when it last went back to the pool
        self._buffer = bytearray()
        self._answer: asyncio.Future[Answer] | None = None
        self._status = 0
        self._retry_after_s: float | None = None
        self._body_at = -1  # where the body starts in the buffer, once the headers are read
        self._body_length = -1  # -1: chunked

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def connection_lost(self, error: Exception | None) -> None:
        self.reusable = False
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(HttpError(f"connection closed before the answer: {error or 'by the server'}"))

    def send(self, request: bytes) -> asyncio.Future[Answer]:
        assert self.transport is not None and self._answer is None
        self._answer = asyncio.get_running_loop().create_future()
        self._buffer.clear()
        self._body_at = -1
        self._retry_after_s = None
        self.transport.write(request)
        return self._answer

    def data_received(self, data: bytes) -> None:
        if self._answer is None or self._answer.done():
            self.reusable = False  # bytes nobody asked for: this connection cannot be trusted again
            return
        self._buffer += data
        try:
            if self._body_at < 0 and not self._read_head():
                return
        except HttpError as error:
            self.reusable = False
            self._answer.set_exception(error)
            return
        try:
            body, end = self._read_body()
        except HttpError as error:
            self.reusable = False
            self._answer.set_exception(error)
            return
        if body is not None:
            if len(self._buffer) > end:
                self.reusable = False
            answer, self._answer = self._answer, None
            answer.set_result(Answer(self._status, body, self._retry_after_s))

    def _read_body(self) -> tuple[bytes | None, int]:
        """The whole body and where it ends in the buffer, or (None, 0) while it is not all in."""
        if self._body_length >= 0:
            end = self._body_at + self._body_length
            return (bytes(self._buffer[self._body_at : end]), end) if len(self._buffer) >= end else (None, 0)
        body, at = bytearray(), self._body_at
        while True:  # chunks: a hex size line, the data, CRLF; a zero size, then trailers and CRLF
            line_end = self._buffer.find(b"\r\n", at)
            if line_end < 0:
                return None, 0
            size_text = bytes(self._buffer[at:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise HttpError(f"bad chunk size {size_text[:20]!r}") from None
            if size == 0:
                end = self._buffer.find(_HEADER_END, line_end)  # no trailers: the CRLF right after
                if end < 0:
                    return None, 0
                return bytes(body), end + len(_HEADER_END)
            data_at = line_end + 2
            if len(self._buffer) < data_at + size + 2:
                return None, 0
            body += self._buffer[data_at : data_at + size]
            at = data_at + size + 2

    def _read_head(self) -> bool:
        """Parse the status line and headers once they are all in; False while they are not."""
        end = self._buffer.find(_HEADER_END)
        if end < 0:
            if len(self._buffer) > MAX_HEADER_BYTES:
                raise HttpError(f"answer headers longer than {MAX_HEADER_BYTES} bytes")
            return False
        lines = bytes(self._buffer[:end]).split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise HttpError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        self._status = int(parts[1])
        if self._status < 200:
            raise HttpError(f"interim answer {self._status} is not supported")
        length = -2  # not stated
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value.strip())
            elif name == b"transfer-encoding":
                if value.strip().lower() != b"chunked":
                    raise HttpError(f"Transfer-Encoding {value.strip()!r} is not supported")
                length = -1
            elif name == b"connection" and value.strip().lower() == b"close":
                self.reusable = False
            elif name == b"retry-after" and value.strip().isdigit():
                self._retry_after_s = float(value.strip())
        if length == -2:
            raise HttpError("answer with neither Content-Length nor chunked Transfer-Encoding")
        self._body_at, self._body_length = end + len(_HEADER_END), length
        return True


class HttpPool:
    """Keep-alive connections to one ``http://host:port``, opened as requests need them,
    at most ``limit`` at once (a request past the limit waits for a free one)."""

    def __init__(
        self,
        base_url: str,
        limit: int = 4000,
        max_idle_s: float = MAX_IDLE_S,
        clock: Callable[[], float] = time.monotonic,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """``headers``: sent with every request (an Authorization, say)."""
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"only http://host:port URLs are supported, not {base_url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self._host_header = f"{self.host}:{self.port}".encode()
        self._extra = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in (headers or {}).items())
        self._idle: deque[_Connection] = deque()  # oldest return on the left
        self._max_idle_s = max_idle_s
        self._clock = clock
        self._slots = asyncio.Semaphore(limit)
        self._open: set[_Connection] = set()

    async def request(
        self,
        method: str,
        target: str,
        body: bytes = b"",
        content_type: bytes = b"application/json",
        timeout_s: float = 60.0,
    ) -> tuple[int, bytes]:
        """Send one request and return (status, body)."""
        answer = await self.exchange(method, target, body, content_type, timeout_s)
        return answer.status, answer.body

    async def exchange(
        self,
        method: str,
        target: str,
        body: bytes = b"",
        content_type: bytes = b"application/json",
        timeout_s: float = 60.0,
    ) -> Answer:
        """Send one request and return its whole answer."""
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\n%s" % (method.encode(), target.encode(), self._host_header, self._extra)
        if body or method in ("POST", "PUT", "PATCH"):
            head += b"Content-Type: %s\r\nContent-Length: %d\r\n" % (content_type, len(body))
        request = head + b"\r\n" + body
        async with self._slots:
            connection = await self._connection()
            try:
                answer = await asyncio.wait_for(connection.send(request), timeout_s)
            except BaseException:
                self._discard(connection)
                raise
            if connection.reusable:
                connection.idle_since = self._clock()
                self._idle.append(connection)
            else:
                self._discard(connection)
            return answer

    async def _connection(self) -> _Connection:
        stale_before = self._clock() - self._max_idle_s
        while self._idle and self._idle[0].idle_since < stale_before:
            self._discard(self._idle.popleft())
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable:
                return connection
            self._discard(connection)
        _, connection = await asyncio.get_running_loop().create_connection(_Connection, self.host, self.port)
        self._open.add(connection)
        return connection

    def _discard(self, connection: _Connection) -> None:
        self._open.discard(connection)
        if connection.transport is not None:
            connection.transport.close()

    async def close(self) -> None:
        for connection in list(self._open):
            self._discard(connection)
        self._idle.clear()
