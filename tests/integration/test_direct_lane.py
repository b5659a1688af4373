"""The direct lane answers the two task routes inside the HTTP protocol exactly as FastAPI's
own routes do (the same status, body and headers, good requests and bad, auth on), never
through the ASGI app; and what it cannot take (an Origin header, a pipelined request, every
other route) still reaches the ASGI app. Its connection handling holds: keep-alive,
HTTP/1.0, pipelining, a body in pieces, a body that never ends, one that is too large.

A real uvicorn server with Brimful's protocol runs in this process over the session's real
broker, Redis and Triton, beside the bare FastAPI app over the same state.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from prometheus_client import REGISTRY
from starlette.types import ASGIApp, Receive, Scope, Send

from brimful.api.app import ServedApp, create_app
from brimful.api.http.guards import BrowserGuard
from brimful.api.http.http_protocol import BoundedHttpProtocol
from brimful.api.state import ApiState
from brimful.core.api_keys import ApiKeys
from brimful.core.api_keys import Scope as KeyScope
from brimful.core.redis_keys import RedisKeys
from brimful.stack import EmbeddedStack, free_port
from tests.helpers.lanes import both, ready, submit_cases
from tests.helpers.polling import wait_for

READ_TIMEOUT_S = 1.0  # the in-process server's body deadline (the handler's, from its settings)


class CountingAsgi:
    """The ASGI app behind the server, counting the HTTP requests that reach it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.requests: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.requests.append(f"{scope['method']} {scope['path']}")
        await self.app(scope, receive, send)


class Served:
    """The server's address, the bare FastAPI app's client, the ASGI counter, API keys."""

    def __init__(
        self, port: int, plain: httpx.AsyncClient, asgi: CountingAsgi, keys: dict[str, str], max_body_bytes: int
    ) -> None:
        self.max_body_bytes = max_body_bytes
        self.port = port
        self.plain = plain
        self.asgi = asgi
        self.keys = keys

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
async def served(stack: EmbeddedStack) -> AsyncIterator[Served]:
    settings = stack.settings.model_copy(update={"auth_enabled": True, "api_read_timeout_s": READ_TIMEOUT_S})
    app = create_app(settings)
    assert isinstance(app, ServedApp) and app.direct_lane is not None and isinstance(app.app, BrowserGuard)
    fastapi_app = app.app.app
    assert isinstance(fastapi_app, FastAPI)
    asgi = CountingAsgi(app.app)
    app.app = asgi
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, http=BoundedHttpProtocol, lifespan="on", log_config=None, access_log=False
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        await wait_for(lambda: server.started or serving.done(), 30, "the in-process API to start")
        assert not serving.done(), serving
        state: ApiState = fastapi_app.state.brimful
        issuer = ApiKeys(state.redis, RedisKeys(settings.key_prefix))
        keys = {
            "submit": (await issuer.create("direct-test", [KeyScope.SUBMIT, KeyScope.READ]))[0],
            "read": (await issuer.create("direct-test", [KeyScope.READ]))[0],
        }
        transport = httpx.ASGITransport(app=fastapi_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api", timeout=30) as plain:
            await ready(plain)
            yield Served(port, plain, asgi, keys, settings.max_body_bytes)
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)


def answered(route: str, status: int) -> float:
    return REGISTRY.get_sample_value("brimful_http_responses_total", {"route": route, "status": str(status)}) or 0.0


async def test_submissions_and_reads_are_answered_as_fastapi_answers_them_past_asgi(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url(), timeout=30) as direct:
        before = answered("/v1/tasks", 202)
        for name, path, key, kwargs in submit_cases(served.keys):
            plain, ours = await both((served.plain, direct), "POST", path, key, **kwargs)
            assert ours == plain, name
            if name == "done inline":
                assert plain[0] == 200 and "SHA256" in plain[1], plain
        done = await direct.post(
            "/v1/tasks?wait=10",
            json={"inputs": {"TEXT": "direct read"}},
            headers={"Authorization": f"Bearer {served.keys['submit']}"},
        )
        assert done.status_code == 200, done.text
        task_id = done.json()["task_id"]
        for name, path, key in [
            ("done", f"/v1/tasks/{task_id}", served.keys["read"]),
            ("done, long-poll", f"/v1/tasks/{task_id}?wait=5", served.keys["read"]),
            ("no key", f"/v1/tasks/{task_id}", None),
            ("unknown task", f"/v1/tasks/{'0' * 32}", served.keys["read"]),
            ("malformed id", "/v1/tasks/not-an-id", served.keys["read"]),
            ("bad wait", f"/v1/tasks/{task_id}?wait=-1", served.keys["read"]),
        ]:
            plain, ours = await both((served.plain, direct), "GET", path, key)
            assert ours == plain, name
        assert plain[0] == 400
        # Every one of those went past the ASGI app, and each answer was counted by route.
        assert served.asgi.requests == []
        assert answered("/v1/tasks", 202) == before + 1  # "accepted" (the plain app counts nothing)


async def test_what_the_direct_lane_does_not_take_reaches_the_asgi_app(served: Served) -> None:
    key = {"Authorization": f"Bearer {served.keys['submit']}"}
    async with httpx.AsyncClient(base_url=served.url(), timeout=30) as direct:
        origin = {**key, "Origin": "https://elsewhere.example"}
        refused = await direct.post("/v1/tasks", headers=origin, json={"inputs": {}})  # the browser guard's
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "cross_origin", refused.text
        other = await direct.get("/v1/models", headers=key)
        escaped = await direct.get("/v1/tasks/%30", headers=key)
    assert other.status_code == 200 and escaped.status_code == 400, (other.text, escaped.text)
    assert served.asgi.requests == ["POST /v1/tasks", "GET /v1/models", "GET /v1/tasks/0"]


async def exchange(port: int, raw: bytes, answers: int = 1, timeout_s: float = 10.0) -> list[tuple[int, bytes]]:
    """Send ``raw`` on a new connection; read ``answers`` answers (status, body) and
    whether the server then closed it (a final (0, b"") when it did)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got: list[tuple[int, bytes]] = []
    try:
        writer.write(raw)
        async with asyncio.timeout(timeout_s):
            for _ in range(answers):
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                fields = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
                got.append((int(lines[0].split()[1]), await reader.readexactly(int(fields["content-length"]))))
            if await reader.read(1) == b"":
                got.append((0, b""))
    except TimeoutError:
        pass  # still open: no closing mark
    finally:
        writer.close()
    return got


def post(body: bytes, key: str, extra: bytes = b"", declared: int | None = None) -> bytes:
    length = len(body) if declared is None else declared
    return (
        b"POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer %s\r\nContent-Length: %d\r\n%s\r\n" % (key.encode(), length, extra)
    ) + body


async def test_connections_keep_alive_pipeline_and_close_as_http_says(served: Served) -> None:
    key = served.keys["submit"]
    task = b'{"inputs": {"TEXT": "pipelined"}}'
    # Two requests in one write: both answered, in order; the second waited for the first.
    read_unknown = b"GET /v1/tasks/%s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n\r\n" % (
        b"0" * 32,
        served.keys["read"].encode(),
    )
    answers = await exchange(served.port, post(task, key) + read_unknown, answers=2, timeout_s=3)
    assert [status for status, _ in answers[:2]] == [202, 404], answers
    assert len(answers) == 2  # kept alive: not closed after them
    assert served.asgi.requests == [f"GET /v1/tasks/{'0' * 32}"]  # the one queued behind the first
    # HTTP/1.0: answered, then closed.
    old = post(task, key).replace(b"HTTP/1.1", b"HTTP/1.0", 1)
    assert [status for status, _ in await exchange(served.port, old)] == [202, 0]


async def test_a_pipelined_request_whose_body_comes_after_the_answer_before_it_is_answered(
    served: Served,
) -> None:
    """A request pipelined behind another whose body arrives only once the first is answered:
    the first answer must not end the connection for the second's unread body."""
    task = b'{"inputs": {"TEXT": "pipelined, body later"}}'
    read_unknown = b"GET /v1/tasks/%s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n\r\n" % (
        b"0" * 32,
        served.keys["read"].encode(),
    )
    for second_head in (post(b"", served.keys["submit"], declared=len(task)), _asgi_post(task, served)):
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        try:
            writer.write(read_unknown + second_head)  # the second's head behind the first, no body yet
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 404"), head
            length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
            await reader.readexactly(length)
            writer.write(task)  # the second's body, after the first answer
            second = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert second.startswith(b"HTTP/1.1 202"), second
        finally:
            writer.close()


def _asgi_post(body: bytes, served: Served) -> bytes:
    """A submission the direct lane leaves to the ASGI app (it carries an Origin header)."""
    return post(b"", served.keys["submit"], extra=b"Origin: http://127.0.0.1\r\n", declared=len(body))


async def test_a_body_in_pieces_is_read_and_one_that_stops_gets_408(served: Served) -> None:
    key = served.keys["submit"]
    body = b'{"inputs": {"TEXT": "in pieces"}}'
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(post(body[:10], key, declared=len(body)))
    await writer.drain()
    await asyncio.sleep(0.2)  # the rest comes later, within the deadline: a separate packet
    writer.write(body[10:])
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.close()
    assert head.startswith(b"HTTP/1.1 202"), head
    before = answered("/v1/tasks", 408)
    answers = await exchange(served.port, post(body[:10], key, declared=len(body)), timeout_s=READ_TIMEOUT_S + 5)
    assert answers and answers[0][0] == 408, answers
    assert json.loads(answers[0][1])["error"]["code"] == "request_timeout"
    assert answered("/v1/tasks", 408) == before + 1
    assert served.asgi.requests == []


async def test_too_large_bodies_get_413_and_the_connection_ends(served: Served) -> None:
    key = served.keys["submit"]
    declared = await exchange(served.port, post(b"", key, declared=served.max_body_bytes + 1))
    assert declared[0][0] == 413 and b"body_too_large" in declared[0][1], declared
    # No length declared: chunked, and past the limit as it streams.
    chunk = b"x" * 65536
    chunked = (
        b"POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer %s\r\nTransfer-Encoding: chunked\r\n\r\n" % key.encode()
    ) + (b"%x\r\n%s\r\n" % (len(chunk), chunk)) * (served.max_body_bytes // len(chunk) + 2)
    streamed = await exchange(served.port, chunked)
    assert streamed[0][0] == 413 and b"body exceeds the limit" in streamed[0][1], streamed
    assert streamed[-1] == (0, b""), streamed  # the rest is not read: the connection ended
    assert served.asgi.requests == []


async def test_a_client_gone_mid_body_is_counted_and_the_server_goes_on(served: Served) -> None:
    key = served.keys["submit"]
    before = answered("/v1/tasks", 499)
    _, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(post(b'{"inputs": ', key, declared=100))
    await writer.drain()
    writer.close()
    await wait_for(lambda: answered("/v1/tasks", 499) == before + 1, 10, "the hang-up to be counted as 499")
    answers = await exchange(served.port, post(b'{"inputs": {"TEXT": "after"}}', key))
    assert answers[0][0] == 202, answers
