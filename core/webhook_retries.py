"""When a webhook delivery that failed is tried again, and what a receiver's answer does to
its endpoint: pure decisions, on the caller's clock and random source.

- The waits are ``webhook_retry_delays_s``, each spread by up to ``JITTER`` either way, so
  the deliveries a receiver's outage failed together do not all return at once.
- A receiver's ``Retry-After`` (seconds, or an HTTP date) is honoured: the next attempt
  waits at least that long, up to ``MOST_RETRY_AFTER_S``.
- 429, 502, 503 and 504 say the receiver is overloaded or away: its endpoint is throttled
  (``throttles``), its other deliveries waiting until the next attempt of this one.
- 410 says the endpoint is gone for good: it is disabled (``disables``).
- A delivery whose next attempt would fall past ``webhook_retry_window_s`` from its event,
  or past the last wait, is dead.
"""

from __future__ import annotations

import email.utils
from collections.abc import Callable, Sequence

JITTER = 0.2  # a wait is spread over [1 - JITTER, 1 + JITTER] of itself
MOST_RETRY_AFTER_S = 24 * 3600.0  # a Retry-After longer than this is read as this
THROTTLING = frozenset({429, 502, 503, 504})
GONE = 410


def next_delay_s(attempts: int, delays_s: Sequence[float]) -> float | None:
    """The scheduled wait before the next attempt after ``attempts`` failed ones; None: no more."""
    return delays_s[attempts - 1] if 1 <= attempts <= len(delays_s) else None


def retry_after_s(header: str | None, now_s: float) -> float | None:
    """A ``Retry-After`` header's wait in seconds (delta-seconds or an HTTP date), at most
    ``MOST_RETRY_AFTER_S``; None when absent or unreadable."""
    if not header:
        return None
    text = header.strip()
    if text.isascii() and text.isdigit():
        return min(float(text), MOST_RETRY_AFTER_S)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return min(max(when.timestamp() - now_s, 0.0), MOST_RETRY_AFTER_S)


def next_attempt_ms(
    attempts: int,
    delays_s: Sequence[float],
    created_at_ms: int,
    window_s: float,
    now_ms: int,
    retry_after: float | None,
    random: Callable[[], float],
) -> int | None:
    """When to try a delivery again after ``attempts`` failed ones (ms), or None: it is dead.
    ``random``: a number in [0, 1), for the jitter."""
    delay = next_delay_s(attempts, delays_s)
    if delay is None:
        return None
    delay *= 1 + JITTER * (2 * random() - 1)
    if retry_after is not None:
        delay = max(delay, retry_after)
    at_ms = now_ms + int(delay * 1000)
    return None if at_ms - created_at_ms > window_s * 1000 else at_ms


def throttles(status: int) -> bool:
    """Whether an answer holds back the endpoint's other deliveries too."""
    return status in THROTTLING


def disables(status: int) -> bool:
    """Whether an answer disables the endpoint (410 Gone, as Standard Webhooks says)."""
    return status == GONE


def failing_too_long(failing_since_ms: int, now_ms: int, disable_after_s: float) -> bool:
    """Whether an endpoint whose deliveries have failed since ``failing_since_ms`` (0: not
    failing), with none delivered since, is disabled."""
    return failing_since_ms > 0 and now_ms - failing_since_ms >= disable_after_s * 1000
