"""When the embedded stack starts a dead child again: pure, on a virtual clock."""

from __future__ import annotations

from brimful.stack import RestartBackoff


def test_the_wait_doubles_while_a_child_keeps_dying_and_is_capped() -> None:
    backoff = RestartBackoff(first_s=0.5, max_s=4.0, stable_s=60.0)
    backoff.started("batcher-0", now=0.0)
    waits = []
    now = 1.0
    for _ in range(6):
        waits.append(backoff.delay("batcher-0", now))
        now += waits[-1]
        backoff.started("batcher-0", now)
        now += 1.0  # dies a second after each start
    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_a_child_that_stayed_up_long_enough_starts_over() -> None:
    backoff = RestartBackoff(first_s=0.5, max_s=30.0, stable_s=60.0)
    backoff.started("api", now=0.0)
    assert backoff.delay("api", now=1.0) == 0.5
    backoff.started("api", now=1.5)
    assert backoff.delay("api", now=2.0) == 1.0
    backoff.started("api", now=3.0)
    assert backoff.delay("api", now=100.0) == 0.5  # up for 97 s: a fresh failure
    assert backoff.delay("redis", now=100.0) == 0.5  # children are counted apart
