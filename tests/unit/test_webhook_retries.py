"""When a failed webhook delivery is tried again (core/webhook_retries.py), and the
signatures of an endpoint whose secret rotates (core/webhook_signing.py), checked by the
``standardwebhooks`` library, unmodified."""

from __future__ import annotations

import email.utils
import time

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from brimful.core.webhook_records import Endpoint
from brimful.core.webhook_retries import (
    JITTER,
    MOST_RETRY_AFTER_S,
    disables,
    failing_too_long,
    next_attempt_ms,
    retry_after_s,
    throttles,
)
from brimful.core.webhook_signing import new_secret, signed_headers

DELAYS = [5.0, 300.0, 1800.0]
NOW_MS = 1_000_000_000


def attempt_after(attempts: int, random: float, retry_after: float | None = None, window_s: float = 1e9) -> int | None:
    return next_attempt_ms(attempts, DELAYS, NOW_MS, window_s, NOW_MS, retry_after, lambda: random)


def test_each_wait_is_spread_a_fifth_either_way_around_its_schedule() -> None:
    for attempts, scheduled in enumerate(DELAYS, start=1):
        low, middle, high = (attempt_after(attempts, r) for r in (0.0, 0.5, 0.999999))
        assert middle == NOW_MS + scheduled * 1000
        assert low == NOW_MS + int(scheduled * (1 - JITTER) * 1000)
        assert high is not None and NOW_MS + scheduled * 1000 < high <= NOW_MS + scheduled * (1 + JITTER) * 1000


def test_past_the_last_wait_or_the_window_a_delivery_is_dead() -> None:
    assert attempt_after(len(DELAYS) + 1, 0.5) is None
    assert attempt_after(0, 0.5) is None
    assert attempt_after(2, 0.5, window_s=299) is None  # the next attempt would fall past the window
    assert attempt_after(2, 0.5, window_s=301) == NOW_MS + 300_000


def test_a_receivers_retry_after_is_a_floor_never_a_shortcut() -> None:
    assert attempt_after(1, 0.5, retry_after=60.0) == NOW_MS + 60_000  # longer than the 5 s scheduled
    assert attempt_after(2, 0.5, retry_after=1.0) == NOW_MS + 300_000  # shorter: the schedule holds


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("120", 120.0),
        (" 7 ", 7.0),
        ("99999999", MOST_RETRY_AFTER_S),
        (email.utils.formatdate(NOW_MS / 1000 + 90, usegmt=True), 90.0),
        (email.utils.formatdate(NOW_MS / 1000 - 90, usegmt=True), 0.0),  # a date passed: now
        (None, None),
        ("", None),
        ("soon", None),
        ("-5", None),
        ("1.5", None),
        ("²", None),  # a digit to str.isdigit, not to HTTP
        ("Mon, 32 Foo 2026 99:99:99", None),
    ],
)
def test_retry_after_reads_seconds_or_a_date_and_nothing_else(header: str | None, expected: float | None) -> None:
    assert retry_after_s(header, NOW_MS / 1000) == expected


def test_overload_throttles_the_endpoint_and_gone_disables_it() -> None:
    assert all(throttles(status) for status in (429, 502, 503, 504))
    assert not any(throttles(status) for status in (0, 400, 404, 410, 500))
    assert disables(410) and not any(disables(status) for status in (404, 429, 500, 0))


def test_an_endpoint_is_disabled_only_after_failing_the_whole_bound() -> None:
    assert not failing_too_long(0, NOW_MS, 60)  # not failing
    assert not failing_too_long(NOW_MS - 59_999, NOW_MS, 60)
    assert failing_too_long(NOW_MS - 60_000, NOW_MS, 60)


def endpoint(secret: str, previous: str = "", until: int = 0) -> Endpoint:
    return Endpoint("we_1", "acme", "https://example.com/hook", ("task.completed",), secret, "", 0, previous, until)


def test_during_a_rotation_either_secret_verifies_and_after_it_only_the_new_one() -> None:
    old, new = new_secret(), new_secret()
    rotating = endpoint(new, previous=old, until=1000)  # the old one signs until 1000 s
    body = b'{"type": "task.completed"}'
    now = int(time.time())  # the verifier refuses a stale webhook-timestamp
    during = signed_headers(rotating.signing_secrets(999.0), "msg_1", now, body)
    assert len(during["webhook-signature"].split(" ")) == 2
    for secret in (old, new):  # a receiver holding only one of them
        assert Webhook(secret).verify(body, during) == {"type": "task.completed"}
    assert rotating.signing_secrets(1000.0) == [new]
    after = signed_headers(rotating.signing_secrets(1000.0), "msg_1", now, body)
    with pytest.raises(WebhookVerificationError):
        Webhook(old).verify(body, after)
    assert Webhook(new).verify(body, after) == {"type": "task.completed"}
    assert endpoint(new).signing_secrets(0.0) == [new]
