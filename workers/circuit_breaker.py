"""A circuit breaker for one model endpoint: pure state on an injected clock.

Closed: calls go through. After ``failure_threshold`` transient failures in a row it
opens: no calls until ``open_for`` has passed; then half-open: one probe call is let
through; its success closes the circuit, its failure opens it again for twice as long
(capped at ``max_open_s``, with jitter so batchers do not probe in step).
"""

from __future__ import annotations

import random
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Decides whether a call to the endpoint may be made now."""

    def __init__(
        self,
        failure_threshold: int = 3,
        base_open_s: float = 0.5,
        max_open_s: float = 5.0,
        probe_timeout_s: float = 30.0,
        rng: random.Random | None = None,
    ) -> None:
        self.failure_threshold = failure_threshold
        self.base_open_s = base_open_s
        self.max_open_s = max_open_s
        # A probe whose outcome was never reported (its caller died, or failed on
        # something else first) must not close the door for good.
        self.probe_timeout_s = probe_timeout_s
        self._probe_started = 0.0
        self._rng = rng or random.Random()
        self._state = BreakerState.CLOSED
        self._consecutive_failures = 0
        self._opened_times = 0
        self._retry_at = 0.0
        self._probe_in_flight = False

    def state(self, now: float) -> BreakerState:
        if self._state is BreakerState.OPEN and now >= self._retry_at:
            return BreakerState.HALF_OPEN
        return self._state

    def would_allow(self, now: float) -> bool:
        """Whether ``allow`` would let a call through now, without taking the probe."""
        state = self.state(now)
        if state is BreakerState.CLOSED:
            return True
        probe_lost = self._probe_in_flight and now - self._probe_started >= self.probe_timeout_s
        return state is BreakerState.HALF_OPEN and (not self._probe_in_flight or probe_lost)

    def allow(self, now: float) -> bool:
        """Whether a call may start now; in half-open, only the first caller's may."""
        state = self.state(now)
        if state is BreakerState.CLOSED:
            return True
        probe_lost = self._probe_in_flight and now - self._probe_started >= self.probe_timeout_s
        if state is BreakerState.HALF_OPEN and (not self._probe_in_flight or probe_lost):
            self._state = BreakerState.HALF_OPEN
            self._probe_in_flight = True
            self._probe_started = now
            return True
        return False

    @property
    def consecutive_failures(self) -> int:
        """Transient failures since the last success."""
        return self._consecutive_failures

    def abort_probe(self) -> None:
        """The probe ``allow`` let through was never made (its slot was taken elsewhere):
        the next caller may probe."""
        self._probe_in_flight = False

    def seconds_until_allowed(self, now: float) -> float:
        if self.state(now) is BreakerState.OPEN:
            return max(0.0, self._retry_at - now)
        return 0.0

    def record_success(self) -> None:
        self._state = BreakerState.CLOSED
        self._consecutive_failures = 0
        self._opened_times = 0
        self._probe_in_flight = False

    def trip(self, now: float) -> bool:
        """Open a closed circuit on news from elsewhere (another batcher's circuit for the
        same endpoint opened), as if its own threshold were reached; after the open period
        a probe decides as usual, so wrong news costs one period at most. Returns whether
        the state changed."""
        if self._state is not BreakerState.CLOSED:
            return False
        self._consecutive_failures = self.failure_threshold
        self._open(now)
        return True

    def record_failure(self, now: float) -> None:
        """A transient failure (unreachable, timed out). Model errors are not the
        endpoint's health and are not recorded here."""
        self._consecutive_failures += 1
        self._probe_in_flight = False
        if self._state is BreakerState.HALF_OPEN or self._consecutive_failures >= self.failure_threshold:
            self._open(now)

    def _open(self, now: float) -> None:
        self._opened_times += 1
        cap = min(self.max_open_s, self.base_open_s * 2 ** (self._opened_times - 1))
        self._retry_at = now + self._rng.uniform(cap / 2, cap)
        self._state = BreakerState.OPEN
