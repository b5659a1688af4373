"""The batcher's own small HTTP server: Prometheus ``/metrics`` and the probes.

- ``GET /metrics``: this process's metrics, each sample labelled with the model served.
- ``GET /healthz``: liveness. 200 while the event loop answers, the fetch loop came
  back recently, and rows that wait see the model slots move; a batcher wedged in its
  consumer or its slots fails it and gets restarted.
- ``GET /readyz``: 200 once the batcher has joined the consumer group and consumes.
- ``GET /status``: JSON for people: assigned partitions, paused for an outage, and each
  model endpoint's in-flight calls, capacity and breaker.

It runs on the batcher's own event loop (so liveness proves the loop turns), answers one
request per connection, and bounds what a caller can make it hold: the request head's
size, the time to send it, and the connections open at once. Past that many, a new
connection closes the one that has waited longest without sending its head, so sockets
that send nothing never keep the kubelet's probe out (it would restart a healthy batcher).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger("brimful.batcher")

MAX_HEAD_BYTES = 8192
HEAD_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 32


@dataclass(frozen=True)
class Probes:
    """What the server asks the batcher; each call is cheap and does no I/O."""

    seconds_since_fetch: Callable[[], float | None]  # None: not consuming yet
    consuming: Callable[[], bool]
    status: Callable[[], dict[str, object]]
    stale_after_s: float = 60.0
    slots_stalled_s: Callable[[], float] = lambda: 0.0  # rows waiting while no slot moved, seconds
    stall_after_s: float = 120.0
    metrics_text: Callable[[], bytes] = generate_latest  # the Prometheus exposition served


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes


_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


def _json(status: int, value: object) -> Answer:
    return Answer(status, "application/json", json.dumps(value).encode())


def answer(method: str, path: str, probes: Probes) -> Answer:
    """The answer to one request (pure apart from reading the metrics registry)."""
    if method not in ("GET", "HEAD"):
        return _json(405, {"error": {"code": "method_not_allowed", "message": f"{method} is not served here"}})
    if path == "/metrics":
        return Answer(200, CONTENT_TYPE_LATEST, probes.metrics_text())
    if path == "/healthz":
        since = probes.seconds_since_fetch()
        stalled = probes.slots_stalled_s()
        alive = (since is None or since <= probes.stale_after_s) and stalled <= probes.stall_after_s
        return _json(200 if alive else 503, {"alive": alive, "seconds_since_fetch": since, "slots_stalled_s": stalled})
    if path == "/readyz":
        ready = probes.consuming()
        return _json(200 if ready else 503, {"ready": ready})
    if path == "/status":
        return _json(200, probes.status())
    return _json(404, {"error": {"code": "not_found", "message": f"{path}: try /metrics, /healthz, /readyz, /status"}})


class HealthServer:
    """Serves ``answer`` on ``host:port`` until closed."""

    def __init__(self, host: str, port: int, probes: Probes) -> None:
        self._host = host
        self._port = port
        self._probes = probes
        self._server: asyncio.Server | None = None
        self._open = 0
        # Connections whose head has not arrived yet, with when each opened: the ones to shed.
        self._waiting: dict[asyncio.StreamWriter, float] = {}

    @property
    def port(self) -> int:
        """The bound port (useful when asked for port 0)."""
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, self._port, limit=MAX_HEAD_BYTES)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _shed_longest_waiting(self) -> bool:
        """Close the connection that has waited longest for its head; False if none waits."""
        if not self._waiting:
            return False
        oldest = min(self._waiting, key=self._waiting.__getitem__)
        del self._waiting[oldest]
        oldest.transport.abort()
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open += 1
        try:
            if self._open > MAX_CONNECTIONS and not self._shed_longest_waiting():
                return  # every place holds a request being answered
            self._waiting[writer] = asyncio.get_running_loop().time()
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=HEAD_TIMEOUT_S)
            except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            finally:
                self._waiting.pop(writer, None)
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            if len(parts) != 3:
                reply = _json(400, {"error": {"code": "bad_request", "message": "malformed request line"}})
                method = "GET"
            else:
                method, target = parts[0], parts[1]
                reply = answer(method, target.split("?", 1)[0], self._probes)
            reason = _REASONS.get(reply.status, "Bad Request")
            header = (
                f"HTTP/1.1 {reply.status} {reason}\r\nContent-Type: {reply.content_type}\r\n"
                f"Content-Length: {len(reply.body)}\r\nConnection: close\r\n\r\n"
            ).encode()
            writer.write(header if method == "HEAD" else header + reply.body)
            await asyncio.wait_for(writer.drain(), timeout=HEAD_TIMEOUT_S)  # a reader that never reads
        except (TimeoutError, ConnectionError):
            pass
        finally:
            self._open -= 1
            writer.close()
