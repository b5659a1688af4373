"""Retry decisions and error summaries: pure functions."""

from __future__ import annotations

import random

from brimful.api.http.bodies import ApiError, error_of, retry_after
from brimful.workers.model_errors import ErrorClass, summarize
from brimful.workers.retry_policy import BatchRetryPolicy


def test_backoff_doubles_up_to_the_cap_and_stops_after_max_attempts() -> None:
    policy = BatchRetryPolicy(max_attempts=5, base_delay=0.1, max_delay=0.3)
    rng = random.Random(7)
    assert policy.delay_before(1, rng) == 0.0
    delays = [policy.delay_before(attempt, rng) for attempt in (2, 3, 4, 5)]
    caps = [0.1, 0.2, 0.3, 0.3]
    for delay, cap in zip(delays, caps):
        assert delay is not None and cap / 2 <= delay <= cap
    assert policy.delay_before(6, rng) is None


def test_transient_classes_are_the_retry_worthy_ones() -> None:
    assert {c for c in ErrorClass if c.is_transient} == {ErrorClass.UNAVAILABLE, ErrorClass.TIMEOUT}


def test_summarize_keeps_the_exception_line_of_a_traceback() -> None:
    message = (
        "Failed to process the request(s) for model 'm_0_0', message: TritonModelException: Traceback "
        '(most recent call last):\n  File "/x/model.py", line 1, in execute\n    raise e\n'
        "workers.reference_model.ReferenceModelFault: row 0 starts with '!fail': fault hook triggered\n\nAt:\n  /x(1): execute\n"
    )
    assert (
        summarize(message)
        == "workers.reference_model.ReferenceModelFault: row 0 starts with '!fail': fault hook triggered"
    )
    assert summarize("plain message") == "plain message"


def test_retry_after_is_whole_seconds_rounded_up_and_at_least_one_and_exact_in_ms() -> None:
    assert [retry_after(s) for s in (0, 0.2, 1, 2.1, 60)] == ["1", "1", "1", "3", "60"]
    refusal = ApiError(429, "busy", "retry later", {"X-Other": "kept"}, retry_after_s=2.5)
    assert refusal.headers == {"X-Other": "kept", "Retry-After": "3", "retry-after-ms": "2500"}
    assert ApiError(400, "bad", "no").headers is None


def test_an_error_body_is_openais_error_object_typed_by_its_status() -> None:
    cases = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "invalid_request_error",
    }
    cases |= {409: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error", 503: "server_error"}
    for status, kind in cases.items():
        body = error_of(ApiError(status, "some_code", "what went wrong"))
        assert body == {"error": {"message": "what went wrong", "type": kind, "param": None, "code": "some_code"}}
    assert (
        error_of(ApiError(400, "invalid_request", "dimensions: no", param="dimensions"))["error"]["param"]
        == "dimensions"
    )
