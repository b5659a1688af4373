"""The benchmark's own HTTP client (bench/harness/raw_http.py) against a real socket server
that writes answers byte by byte as a test needs them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from bench.harness.raw_http import HttpError, HttpPool

Answer = Callable[[bytes], list[bytes]]  # request bytes -> the pieces written back, in order


@asynccontextmanager
async def server(answer: Answer) -> AsyncIterator[tuple[str, list[int]]]:
    """A server on a free port; yields its URL and the number of requests seen on each
    connection it accepted. An empty piece means: close the connection there."""
    connections: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(0)
        mine = len(connections) - 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                body = await reader.readexactly(length)
                connections[mine] += 1
                for piece in answer(head + body):
                    if not piece:
                        writer.close()
                        return
                    writer.write(piece)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    listening = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", connections
    finally:
        listening.close()
        await listening.wait_closed()


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def test_answers_split_across_reads_come_back_whole_on_one_kept_alive_connection() -> None:
    def answer(request: bytes) -> list[bytes]:
        echoed = request.split(b"\r\n\r\n", 1)[1]
        whole = ok(b"got " + echoed)
        return [whole[:5], whole[5:30], whole[30:]]

    async with server(answer) as (url, connections):
        pool = HttpPool(url)
        try:
            first = await pool.request("POST", "/v1/tasks", b'{"n": 1}')
            second = await pool.request("POST", "/v1/tasks", b'{"n": 2}')
        finally:
            await pool.close()
    assert first == (200, b'got {"n": 1}')
    assert second == (200, b'got {"n": 2}')
    assert connections == [2]


async def test_a_connection_the_server_closes_is_not_used_again() -> None:
    async with server(lambda request: [ok(b"bye", b"Connection: close\r\n"), b""]) as (url, connections):
        pool = HttpPool(url)
        try:
            answers = [await pool.request("GET", "/") for _ in range(2)]
        finally:
            await pool.close()
    assert answers == [(200, b"bye"), (200, b"bye")]
    assert connections == [1, 1]


async def test_a_connection_idle_past_max_idle_is_closed_not_reused() -> None:
    # The server's own keep-alive timeout may close it just as a request goes out on it.
    now = [100.0]
    async with server(lambda request: [ok(b"hi")]) as (url, connections):
        pool = HttpPool(url, max_idle_s=2.0, clock=lambda: now[0])
        try:
            await pool.request("GET", "/")
            now[0] += 1.9
            await pool.request("GET", "/")  # idle 1.9 s: reused
            now[0] += 2.1
            await pool.request("GET", "/")  # idle 2.1 s: a new connection
        finally:
            await pool.close()
    assert connections == [2, 1]


async def test_a_chunked_answer_comes_back_whole_and_the_connection_is_kept() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\na;x=y\r\n0123456789\r\n0\r\n\r\n"
    async with server(lambda request: [chunked[:40], chunked[40:55], chunked[55:]]) as (url, connections):
        pool = HttpPool(url)
        try:
            answers = [await pool.request("GET", "/") for _ in range(2)]
        finally:
            await pool.close()
    assert answers == [(200, b"abc0123456789")] * 2
    assert connections == [2]


async def test_an_answer_without_framing_or_with_another_encoding_is_refused_by_name() -> None:
    for head, named in (
        (b"HTTP/1.1 200 OK\r\n\r\nabc", "neither Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "Transfer-Encoding"),
    ):
        async with server(lambda request, head=head: [head]) as (url, _):  # type: ignore[misc]
            pool = HttpPool(url)
            try:
                with pytest.raises(HttpError, match=named):
                    await pool.request("GET", "/")
            finally:
                await pool.close()


async def test_an_answer_cut_short_fails_that_request_and_the_next_gets_a_new_connection() -> None:
    calls = 0

    def answer(request: bytes) -> list[bytes]:
        nonlocal calls
        calls += 1
        return [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", b""] if calls == 1 else [ok(b"fine")]

    async with server(answer) as (url, connections):
        pool = HttpPool(url)
        try:
            with pytest.raises(HttpError, match="closed before the answer"):
                await pool.request("GET", "/")
            assert await pool.request("GET", "/") == (200, b"fine")
        finally:
            await pool.close()
    assert connections == [1, 1]


async def test_requests_past_the_limit_wait_for_a_free_connection() -> None:
    async with server(lambda request: [ok(b"x")]) as (url, connections):
        pool = HttpPool(url, limit=2)
        try:
            answers = await asyncio.gather(*(pool.request("GET", "/") for _ in range(6)))
        finally:
            await pool.close()
    assert answers == [(200, b"x")] * 6
    assert len(connections) <= 2 and sum(connections) == 6


async def test_an_answers_retry_after_is_read() -> None:
    refused = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 2\r\nContent-Length: 2\r\n\r\n{}"
    async with server(lambda request: [refused]) as (url, _connections):
        pool = HttpPool(url)
        try:
            answer = await pool.exchange("GET", "/v1/tasks/t1?wait=30")
            plain = await pool.request("GET", "/v1/tasks/t1?wait=30")
        finally:
            await pool.close()
    assert answer == (429, b"{}", 2.0)
    assert plain == (429, b"{}")


async def test_the_pools_headers_go_with_every_request() -> None:
    seen: list[bytes] = []

    def answer(request: bytes) -> list[bytes]:
        seen.append(request)
        return [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"]

    async with server(answer) as (url, _connections):
        pool = HttpPool(url, headers={"Authorization": "Bearer bf_k"})
        try:
            await pool.request("POST", "/v1/tasks", b"{}")
            await pool.request("GET", "/v1/tasks/t1")
        finally:
            await pool.close()
    assert len(seen) == 2 and all(b"\r\nAuthorization: Bearer bf_k\r\n" in request for request in seen)
