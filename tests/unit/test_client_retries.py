"""The client's retry decisions: Retry-After honoured, one Idempotency-Key per submission.

The transport is httpx's MockTransport: what is tested is the client's own logic, not
the server's (the server side of 503/Retry-After runs for real in tests/faults)."""

from __future__ import annotations

import httpx
import pytest

from brimful.api.http.bodies import retry_headers
from brimful_client import BrimfulError, Client, RetryPolicy, retry_delay


def test_retry_after_is_honoured_and_capped() -> None:
    policy = RetryPolicy(attempts=5, max_delay_s=10, first_delay_s=0.5)
    assert retry_delay(policy, 1, httpx.Response(503, headers={"Retry-After": "3"})) == 3
    assert retry_delay(policy, 1, httpx.Response(429, headers={"Retry-After": "120"})) == 10
    assert retry_delay(policy, 2, httpx.Response(503)) == 1.0  # no header: exponential backoff
    assert retry_delay(policy, 1, httpx.Response(422)) is None  # the request itself is wrong
    assert retry_delay(policy, 5, httpx.Response(503)) is None  # attempts used up
    assert retry_delay(policy, 1, None) == 0.5  # connection lost
    # an earlier try with the same Idempotency-Key is still being accepted
    assert retry_delay(policy, 1, httpx.Response(409, headers={"Retry-After": "1"})) == 1
    assert retry_delay(policy, 1, httpx.Response(409)) is None  # a cancel that came too late


def test_retry_after_ms_is_read_first_so_a_short_wait_is_not_a_second() -> None:
    policy = RetryPolicy(attempts=5, max_delay_s=10, first_delay_s=0.5)
    both = {"Retry-After": "1", "retry-after-ms": "40"}
    assert retry_delay(policy, 1, httpx.Response(429, headers=both)) == 0.04
    assert retry_delay(policy, 1, httpx.Response(429, headers={"retry-after-ms": "900000"})) == 10  # capped
    # A value that is not ASCII digits is ignored, the whole seconds read instead.
    assert retry_delay(policy, 1, httpx.Response(429, headers={"Retry-After": "2", "retry-after-ms": "-5"})) == 2


def test_the_server_says_a_wait_in_whole_seconds_and_in_milliseconds() -> None:
    assert retry_headers(0.012) == {"Retry-After": "1", "retry-after-ms": "12"}
    assert retry_headers(2.5) == {"Retry-After": "3", "retry-after-ms": "2500"}
    assert retry_headers(0) == {"Retry-After": "1", "retry-after-ms": "1"}


def test_a_retried_submission_keeps_its_idempotency_key() -> None:
    seen_keys: list[str] = []

    def server(request: httpx.Request) -> httpx.Response:
        seen_keys.append(request.headers["Idempotency-Key"])
        if len(seen_keys) < 3:
            return httpx.Response(
                503, headers={"Retry-After": "0"}, json={"error": {"code": "overloaded", "message": "busy"}}
            )
        return httpx.Response(202, json={"task_id": "a" * 32, "status": "queued"})

    client = Client("http://brimful.test", transport=httpx.MockTransport(server))
    assert client.submit({"TEXT": "x"}) == "a" * 32
    assert len(seen_keys) == 3 and len(set(seen_keys)) == 1


def test_giving_up_reports_the_servers_error() -> None:
    def server(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            503, headers={"Retry-After": "0"}, json={"error": {"code": "overloaded", "message": "busy"}}
        )

    client = Client("http://brimful.test", retry=RetryPolicy(attempts=2), transport=httpx.MockTransport(server))
    with pytest.raises(BrimfulError) as error:
        client.submit({"TEXT": "x"})
    assert error.value.status == 503 and error.value.code == "overloaded"
