"""The circuit breaker on a virtual clock."""

from __future__ import annotations

import random

from brimful.workers.endpoint_pool import BreakerState, CircuitBreaker


def breaker() -> CircuitBreaker:
    return CircuitBreaker(failure_threshold=3, base_open_s=1.0, max_open_s=4.0, rng=random.Random(1))


def test_opens_after_the_threshold_of_consecutive_failures() -> None:
    b = breaker()
    for _ in range(2):
        b.record_failure(0.0)
        assert b.allow(0.0)
    b.record_failure(0.0)
    assert b.state(0.0) is BreakerState.OPEN
    assert not b.allow(0.0)
    assert 0.5 <= b.seconds_until_allowed(0.0) <= 1.0


def test_a_success_resets_the_count() -> None:
    b = breaker()
    b.record_failure(0.0)
    b.record_failure(0.0)
    b.record_success()
    b.record_failure(0.0)
    assert b.state(0.0) is BreakerState.CLOSED


def test_half_open_lets_exactly_one_probe_through() -> None:
    b = breaker()
    for _ in range(3):
        b.record_failure(0.0)
    assert b.state(1.0) is BreakerState.HALF_OPEN
    assert b.allow(1.0)
    assert not b.allow(1.0)  # a second caller waits for the probe's outcome
    b.record_success()
    assert b.state(1.0) is BreakerState.CLOSED and b.allow(1.0)


def test_a_failed_probe_reopens_for_longer_up_to_the_cap() -> None:
    b = breaker()
    for _ in range(3):
        b.record_failure(0.0)
    now, waits = 0.0, []
    for _ in range(5):
        now += b.seconds_until_allowed(now)
        assert b.allow(now)
        b.record_failure(now)
        waits.append(b.seconds_until_allowed(now))
    assert waits[0] >= 1.0 and max(waits) <= 4.0
    assert waits[-1] >= 2.0  # grew, then stayed under the cap


def test_a_probe_whose_outcome_is_never_reported_does_not_close_the_door_for_good() -> None:
    breaker = CircuitBreaker(
        failure_threshold=1, base_open_s=1.0, max_open_s=1.0, probe_timeout_s=10.0, rng=random.Random(1)
    )
    breaker.record_failure(now=0.0)
    assert breaker.allow(now=2.0)  # the probe goes out, and its caller never reports back
    assert not breaker.allow(now=5.0)  # while it may still be running, no second probe
    assert breaker.allow(now=12.0)  # presumed lost: another probe may go
    breaker.record_success()
    assert breaker.allow(now=12.5) and breaker.state(12.5) is BreakerState.CLOSED


def test_would_allow_answers_as_allow_would_without_taking_the_probe() -> None:
    b = breaker()
    for _ in range(3):
        b.record_failure(0.0)
    assert not b.would_allow(0.0)  # open
    later = 10.0
    assert b.would_allow(later) and b.would_allow(later)  # asking twice takes nothing
    assert b.allow(later)  # the probe
    assert not b.would_allow(later) and not b.allow(later)  # one probe at a time


def test_news_from_another_batcher_opens_a_closed_circuit_until_a_probe_decides() -> None:
    breaker = CircuitBreaker(failure_threshold=3, base_open_s=0.5, max_open_s=5.0, rng=random.Random(1))
    assert breaker.trip(10.0) is True
    assert breaker.state(10.0) is BreakerState.OPEN and not breaker.allow(10.0)
    assert breaker.trip(10.1) is False  # already open: the news changes nothing
    later = 10.0 + breaker.seconds_until_allowed(10.0)
    assert breaker.state(later) is BreakerState.HALF_OPEN and breaker.allow(later)
    breaker.record_success()  # the endpoint serves after all: wrong news cost one period
    assert breaker.state(later) is BreakerState.CLOSED
    assert breaker.seconds_until_allowed(10.0) == 0.0


def test_news_opens_for_the_first_period_only() -> None:
    breaker = CircuitBreaker(failure_threshold=3, base_open_s=0.5, max_open_s=5.0, rng=random.Random(1))
    breaker.trip(0.0)
    assert 0.25 <= breaker.seconds_until_allowed(0.0) <= 0.5
