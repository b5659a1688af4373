"""Slow, idle, vanishing and oversized clients hold nothing for ever or without bound, and
none of them is a 500.

An API process of its own (``python -m brimful.api``, as deployed) with a read timeout of
1 s, on the session's real broker, Redis and Triton; the clients are raw sockets, since
an HTTP client library would not send half a request.
"""

from __future__ import annotations

import json
import select
import signal
import socket
import sys
import time
from collections.abc import Iterator

import pytest

from brimful.api.http.http_protocol import MAX_HEAD_BYTES
from brimful.stack import EmbeddedStack, read_sample_sums, settings_env, wait_until
from brimful.stack.processes import ManagedProcess, free_port, http_ok

READ_TIMEOUT_S = 1.0
CAPPED_CONNECTIONS = 2
# How long a test waits for the server to act on that timeout before calling it hung.
PATIENCE_S = 15.0
# The Host a client that connected to 127.0.0.1 sends (an open API answers loopback names only).
HEAD = b"POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


@pytest.fixture(scope="module")
def api_port(stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """An API process with a 1 s read timeout."""
    yield from api_process(stack, tmp_path_factory, api_read_timeout_s=READ_TIMEOUT_S)


@pytest.fixture(scope="module")
def capped_api_port(stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """An API process that holds at most ``CAPPED_CONNECTIONS`` connections."""
    yield from api_process(stack, tmp_path_factory, api_max_connections=CAPPED_CONNECTIONS)


def api_process(stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory, **update: object) -> Iterator[int]:
    """Run an API process with these settings and yield its port; after the tests, it must
    stop on SIGTERM and its log hold no unhandled error."""
    port = free_port()
    settings = stack.settings.model_copy(update={"api_port": port, **update})
    log_path = tmp_path_factory.mktemp("slow-clients") / "api.log"
    # uvicorn's 10 s for requests under way, then the API's bounded stop steps.
    api = ManagedProcess(
        "api", [sys.executable, "-m", "brimful.api"], settings_env(settings), log_path, stop_timeout_s=45
    )
    api.start()
    try:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), 60, "slow-client API")
        yield port
    finally:
        exit_code = api.stop()
    logged = log_path.read_text(encoding="utf-8", errors="replace")
    # uvicorn re-raises the SIGTERM it handled once it has stopped: -15 is a clean stop;
    # -9 is the kill after the 45 s.
    assert exit_code in (0, -signal.SIGTERM), (
        f"the API did not stop cleanly within 45 s of SIGTERM ({exit_code}):\n{logged[-5000:]}"
    )
    assert "unhandled error" not in logged, logged[-3000:]


def connect(port: int) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port))
    client.settimeout(PATIENCE_S)
    return client


def read_until_closed(client: socket.socket) -> bytes:
    """Everything the server sends until it closes; fails if it keeps the socket open."""
    received = b""
    while chunk := client.recv(65536):
        received += chunk
    return received


def read_response(client: socket.socket) -> bytes:
    """One whole response on a kept-alive connection: its head, then as many body bytes as
    its Content-Length says. A response may arrive in several segments."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = client.recv(65536)
        assert chunk, f"the server closed the connection mid-response: {received!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:] if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = client.recv(65536)
        assert chunk, f"the server closed the connection mid-body: {received!r}"
        body += chunk
    assert len(body) == length, f"more than one response came: {body!r}"
    return head + b"\r\n\r\n" + body


def answer_of(raw: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def responses(port: int, status: str) -> float:
    sums = read_sample_sums(f"http://127.0.0.1:{port}/metrics", route="/v1/tasks", status=status)
    return sums.get("brimful_http_responses_total", 0.0)


def test_a_connection_that_sends_nothing_is_closed(api_port: int) -> None:
    with connect(api_port) as client:
        assert read_until_closed(client) == b""


def test_headers_that_never_finish_get_408_and_the_connection_closes(api_port: int) -> None:
    with connect(api_port) as client:
        client.sendall(HEAD)  # no blank line: the head never ends
        status, body = answer_of(read_until_closed(client))
    assert status == 408
    assert body["error"]["code"] == "request_timeout"  # type: ignore[index]


def test_a_body_that_never_finishes_gets_408_and_the_connection_closes(api_port: int) -> None:
    with connect(api_port) as client:
        client.sendall(HEAD + b"Content-Length: 100\r\n\r\n" + b'{"inputs": {"TE')
        status, body = answer_of(read_until_closed(client))
    assert status == 408
    assert body["error"]["code"] == "request_timeout"  # type: ignore[index]
    assert "15 bytes came" in body["error"]["message"]  # type: ignore[index]


def test_a_client_that_hangs_up_mid_body_is_counted_499_not_500(api_port: int) -> None:
    before_499, before_500 = responses(api_port, "499"), responses(api_port, "500")
    with connect(api_port) as client:
        client.sendall(HEAD + b"Content-Length: 100\r\n\r\n" + b'{"inputs"')
        client.shutdown(socket.SHUT_RDWR)
    # The server notices the hang-up as soon as it reads the body; poll its counter.
    wait_until(lambda: responses(api_port, "499") > before_499, PATIENCE_S, "the 499 counted")
    assert responses(api_port, "500") == before_500


def test_a_kept_alive_connection_idle_past_the_read_timeout_is_still_served(api_port: int) -> None:
    # The deadline is on a request's head and body, not on the connection: between whole
    # requests only the keep-alive timeout (5 s) applies. What is tested is time passing,
    # so this waits.
    with connect(api_port) as client:
        for text in ("first", "second"):
            body = json.dumps({"inputs": {"TEXT": text}}).encode()
            client.sendall(HEAD + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            answer = read_response(client)
            assert answer.startswith(b"HTTP/1.1 202"), answer
            time.sleep(READ_TIMEOUT_S * 2)


def test_headers_that_keep_growing_get_431_and_the_connection_closes(api_port: int) -> None:
    with connect(api_port) as client:
        client.sendall(HEAD)
        line = b"X-Filler: " + b"f" * 1000 + b"\r\n"
        for _ in range(MAX_HEAD_BYTES // len(line) + 2):  # past the cap, well within the read timeout
            client.sendall(line)
        status, body = answer_of(read_until_closed(client))
    assert status == 431
    assert body["error"]["code"] == "headers_too_large"  # type: ignore[index]


def test_one_header_that_never_ends_gets_431(api_port: int) -> None:
    # No line break at all: the parser holds the value whole until it ends, so the cap
    # must count bytes as they arrive, not headers as they are parsed.
    with connect(api_port) as client:
        client.sendall(HEAD + b"X-Endless: ")
        for _ in range(MAX_HEAD_BYTES // 8192 + 2):
            client.sendall(b"e" * 8192)
        status, body = answer_of(read_until_closed(client))
    assert status == 431
    assert body["error"]["code"] == "headers_too_large"  # type: ignore[index]


def test_a_large_body_in_the_same_packets_as_its_head_is_not_taken_for_a_large_head(
    stack: EmbeddedStack, api_port: int
) -> None:
    # A body near the limit, sent in one write with its head: the head's cap must not count it.
    text = "b" * (stack.settings.max_body_bytes - 100)
    body = json.dumps({"inputs": {"TEXT": text}}).encode()
    with connect(api_port) as client:
        client.sendall(HEAD + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        answer = read_until_closed(client)
    assert answer.startswith(b"HTTP/1.1 202"), answer[:300]


def submit_over(client: socket.socket) -> None:
    body = b'{"inputs": {"TEXT": "over the cap"}}'
    client.sendall(HEAD + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)


def refusals(port: int, reason: str) -> float:
    sums = read_sample_sums(f"http://127.0.0.1:{port}/metrics", reason=reason)
    return sums.get("brimful_refusals_total", 0.0)


def shed(port: int) -> float:
    return read_sample_sums(f"http://127.0.0.1:{port}/metrics").get("brimful_connections_shed_total", 0.0)


def test_idle_connections_past_the_cap_are_shed_for_a_request(capped_api_port: int) -> None:
    before = shed(capped_api_port)
    holders = [connect(capped_api_port) for _ in range(CAPPED_CONNECTIONS + 3)]  # open, sending nothing
    try:
        with connect(capped_api_port) as client:
            submit_over(client)
            answer = read_until_closed(client)
        assert answer.startswith(b"HTTP/1.1 202"), answer[:300]
        closed = 0
        for holder in holders:  # the server closed the idle ones past the cap
            holder.settimeout(0.5)
            try:
                closed += holder.recv(1) == b""
            except TimeoutError:
                pass
        assert closed >= 4, closed
    finally:
        for holder in holders:
            holder.close()
    assert shed(capped_api_port) >= before + 4


def hold_a_request(port: int) -> socket.socket:
    """A request under way: its head sent, its body only begun."""
    holder = connect(port)
    holder.sendall(HEAD + b"Content-Length: 100\r\n\r\n" + b'{"inputs": ')
    return holder


def test_requests_under_way_at_the_cap_refuse_a_request_in_json_but_never_a_probe(capped_api_port: int) -> None:
    before = refusals(capped_api_port, "too_many_connections")
    holders = [hold_a_request(capped_api_port) for _ in range(CAPPED_CONNECTIONS)]
    try:

        def refused() -> bool:  # once the server has read both heads
            with connect(capped_api_port) as client:
                submit_over(client)
                return read_until_closed(client).startswith(b"HTTP/1.1 503")

        wait_until(refused, PATIENCE_S, "a request refused past the cap")
        with connect(capped_api_port) as client:
            submit_over(client)
            answer = read_until_closed(client)
        for probe in ("/healthz", "/readyz"):
            with connect(capped_api_port) as client:
                client.sendall(f"GET {probe} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
                assert read_until_closed(client).startswith(b"HTTP/1.1 200"), probe
    finally:
        for holder in holders:
            holder.close()
    status, body = answer_of(answer)
    assert status == 503, answer[:300]
    assert body["error"]["code"] == "too_many_connections"  # type: ignore[index]
    assert f"limit of {CAPPED_CONNECTIONS} connections" in body["error"]["message"]  # type: ignore[index]
    assert b"\r\nretry-after: 1\r\n" in answer.lower()

    # The holders gone, the cap frees up (the server sees each close a moment later).
    def accepted() -> bool:
        with connect(capped_api_port) as client:
            submit_over(client)
            return read_until_closed(client).startswith(b"HTTP/1.1 202")

    wait_until(accepted, PATIENCE_S, "a task accepted once the holders closed")
    assert refusals(capped_api_port, "too_many_connections") > before


def test_a_client_still_sending_its_body_after_a_413_reads_the_413(api_port: int, stack: EmbeddedStack) -> None:
    # The answer comes before the body is read; the client, not reading yet, sends on.
    # Had the server closed its socket, what the client sends next would meet a reset,
    # and the reset would take the unread answer with it.
    limit = stack.settings.max_body_bytes
    with connect(api_port) as client:
        client.sendall(HEAD + f"Content-Length: {limit + 1}\r\n\r\n".encode() + b'{"inputs": {"TEXT": "')
        readable, _, _ = select.select([client], [], [], PATIENCE_S)
        assert readable, "no answer to a body over the limit"
        for _ in range(8):  # more of the body, after the answer came
            client.sendall(b"y" * 65536)
        answer = read_until_closed(client)
    status, body = answer_of(answer)
    assert status == 413, answer[:300]
    assert body["error"]["code"] == "body_too_large"  # type: ignore[index]


def test_a_request_answered_before_its_small_body_came_keeps_its_connection(api_port: int) -> None:
    # A 400 for the query comes before the body is read; the client sends its body, then
    # its next request on the same connection, as an HTTP client library does.
    body = json.dumps({"inputs": {"TEXT": "answered early"}}).encode()
    head = HEAD.replace(b"/v1/tasks", b"/v1/tasks?wait=%C2%B2")
    with connect(api_port) as client:
        client.sendall(head + f"Content-Length: {len(body)}\r\n\r\n".encode())
        status, answer = answer_of(read_response(client))
        assert status == 400, answer
        client.sendall(body)
        client.sendall(HEAD + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        next_answer = read_response(client)
    assert next_answer.startswith(b"HTTP/1.1 202"), next_answer


def test_a_request_answered_before_a_body_that_never_comes_is_closed(api_port: int) -> None:
    head = HEAD.replace(b"/v1/tasks", b"/v1/tasks?wait=%C2%B2")
    with connect(api_port) as client:
        client.sendall(head + b"Content-Length: 100\r\n\r\n" + b'{"inputs"')
        status, answer = answer_of(read_until_closed(client))  # fails if it stays open
    assert status == 400, answer
