"""Settings that cannot work are refused at start, naming what is wrong."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from brimful.core.settings import Settings


def test_a_fetch_held_for_its_whole_wait_must_come_back_within_the_request_timeout() -> None:
    # A broker that reads old records slowly (Tansu on S3) holds a fetch for its whole wait
    # and answers just after it: at a 4 s ceiling and a 5 s request timeout, fetches under
    # load timed out, looked empty, and were asked again for ever (the 30-minute soak).
    with pytest.raises(ValidationError, match="at most half of kafka_request_timeout_ms"):
        Settings(kafka_request_timeout_ms=5000, kafka_fetch_lagging_max_wait_ms=4000)
    assert Settings(kafka_request_timeout_ms=5000, kafka_fetch_lagging_max_wait_ms=2500)
    assert Settings().kafka_fetch_lagging_max_wait_ms <= Settings().kafka_request_timeout_ms / 2


def test_the_live_policy_settings_are_checked_as_a_live_change_is() -> None:
    with pytest.raises(ValidationError, match="min_wait"):
        Settings(min_wait_ms=300, max_wait_ms=200)
    with pytest.raises(ValidationError, match="max_wait_ms"):
        Settings(max_wait_ms=10_000_000)  # past its upper bound: a typo must not park every batch
