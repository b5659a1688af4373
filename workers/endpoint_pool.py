"""The pool of model endpoints as the batcher sees it: pure state, on an injected clock.

Each endpoint (a Triton server, one per GPU or node) has a capacity (calls it serves well
at once), the calls in flight to it, its own circuit breaker, and a fitted call time
(``CallTimeFit``). The pool answers three questions without I/O:

- which endpoint a call should go to now (``choose``): among those whose circuit is
  closed and that have a free slot, the one expected to finish it soonest; an endpoint
  whose latest call failed comes last at once, before its breaker has seen enough to open;
- what the flush policy may count on (``capacity``): idle model instances now, when the
  next busy one is expected to free, and the time of a full call. An endpoint's slots may
  exceed its instances (``capacity`` > ``instances``): the extra slots only queue the next
  batch at the endpoint, so the policy counts an endpoint busy once its instances are, and
  the next batch keeps filling until just before one frees and only then takes the
  queueing slot, which hides the hand-over without freezing a half-empty batch in Triton's
  queue. A call is expected to end its fitted time after it began (not after its slot was
  taken: marking its tasks running and its lease come first), and "just before" is the
  hand-over itself (``handoff_s``): the measured time from a batch's flush to its call,
  smoothed, plus a margin, so the next call reaches the endpoint as the running one ends;
- what is configured now (``sync``): endpoints added start taking calls; those gone are
  retired (no new calls) and leave once their calls in flight return.

``CallTimeFit``, the time one model call takes, is fitted as ``a * rows + b`` (no clock):
an exponentially weighted least-squares line through (rows, seconds) of recent calls:
recent calls count most, so the fit follows a model that warms up or a GPU that gets
shared. While every call carries the same number of rows the line is undetermined, and
the fit answers the weighted mean for every size.

A slope is kept only when the calls show it: at least twice its standard error above
zero. A model whose calls cost the same whatever their rows (a GPU at small batch sizes)
still shows some slope in noisy times, and a slope fitted on the thin calls of light load
and stretched to a full batch turns a 30 ms call into a predicted 50 ms one.

Each endpoint's ``CircuitBreaker``, pure state on the same clock: closed, calls go through. After ``failure_threshold`` transient failures in a row it
opens: no calls until ``open_for`` has passed; then half-open: one probe call is let
through; its success closes the circuit, its failure opens it again for twice as long
(capped at ``max_open_s``, with jitter so batchers do not probe in step)."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from brimful.core.pool_capacity import PoolCapacity
from brimful.core.task_provenance import endpoint_id


@dataclass
class Endpoint:
    """One model endpoint and what the pool knows of it."""

    url: str
    capacity: int
    breaker: CircuitBreaker
    call_time: CallTimeFit
    in_flight: int = 0
    # For each slot held: when its call began (when the slot was taken, until it does), and
    # the real rows it carries (None: not known, plan for a full batch). Its end is planned
    # from those rows: a line fitted on thin calls and stretched to a full batch overshoots.
    started: list[tuple[float, int | None]] = field(default_factory=list)
    calls: int = 0
    rows: int = 0
    failures: int = 0
    retired: bool = False
    busy_elsewhere_until: float = 0.0  # its slots were all leased by other batchers at our last try

    def open_slots(self, now: float) -> int:
        """Calls it may start now: closed circuit, not retired, not held elsewhere."""
        if self.retired or now < self.busy_elsewhere_until:
            return 0
        if self.breaker.state(now) is not BreakerState.CLOSED:
            return 0
        return max(0, self.capacity - self.in_flight)

    def summary(self, now: float, batch_size: int) -> dict[str, object]:
        """What ``/v1/stats`` shows of it."""
        return {
            "url": self.url,
            "id": endpoint_id(self.url),  # as a task's provenance names it
            "in_flight": self.in_flight,
            "capacity": self.capacity,
            "call_s": round(self.call_time.predict(batch_size), 4),
            "breaker": self.breaker.state(now).value,
            "calls": self.calls,
            "rows": self.rows,
            "failures": self.failures,
            "retired": self.retired,
        }


HANDOFF_ALPHA = 0.1  # weight of each flush-to-call sample in the hand-over estimate
HANDOFF_SAMPLE_MAX_S = 0.05


class EndpointPool:
    """Where each call goes, and what the pool can take."""

    def __init__(
        self,
        capacity: int,
        breaker: Callable[[], CircuitBreaker],
        initial_call_s: float = 0.05,
        instances: int | None = None,
        handoff_s: float = 0.003,
        handoff_margin_s: float = 0.001,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.instances = capacity if instances is None else instances
        if not 1 <= self.instances <= capacity:
            raise ValueError("need 1 <= instances <= capacity")
        self.handoff_s = handoff_s  # flush to call, as measured (``observe_handoff``), plus the margin
        self.handoff_margin_s = handoff_margin_s
        self.capacity_per_endpoint = capacity
        self._new_breaker = breaker
        self._initial_call_s = initial_call_s
        self.endpoints: dict[str, Endpoint] = {}
        self._turn = itertools.count()  # rotates ties, so equal endpoints share the calls
        self._last_pick: dict[str, int] = {}

    # --- membership --------------------------------------------------------------------

    def sync(self, urls: Iterable[str]) -> tuple[list[str], list[str]]:
        """Make the pool the endpoints ``urls``; returns (added, retired). A retired
        endpoint that comes back is reinstated with what was known of it."""
        wanted = list(dict.fromkeys(urls))
        added, retired = [], []
        for url in wanted:
            endpoint = self.endpoints.get(url)
            if endpoint is None:
                self.endpoints[url] = Endpoint(
                    url, self.capacity_per_endpoint, self._new_breaker(), CallTimeFit(self._initial_call_s)
                )
                added.append(url)
            elif endpoint.retired:
                endpoint.retired = False
                added.append(url)
        for url, endpoint in self.endpoints.items():
            if url not in wanted and not endpoint.retired:
                endpoint.retired = True
                retired.append(url)
        return added, retired

    def drop_idle_retired(self) -> list[str]:
        """Forget retired endpoints with nothing in flight; returns their urls."""
        gone = [url for url, e in self.endpoints.items() if e.retired and e.in_flight == 0]
        for url in gone:
            del self.endpoints[url]
            self._last_pick.pop(url, None)
        return gone

    # --- decisions ---------------------------------------------------------------------

    def choose(self, now: float, rows: int) -> Endpoint | None:
        """The endpoint a call of ``rows`` rows should go to now, or None if none can take
        it. A closed endpoint with a free slot first, expected to finish soonest; failing
        that, an endpoint whose breaker lets a probe through (that call is the probe)."""
        open_now = [e for e in self.endpoints.values() if e.open_slots(now) > 0]
        if open_now:
            return min(
                open_now,
                key=lambda e: (
                    e.breaker.consecutive_failures > 0,
                    round(e.call_time.predict(rows), 4),
                    e.in_flight / e.capacity,
                    self._last_pick.get(e.url, -1),
                ),
            )
        for endpoint in self.endpoints.values():
            if endpoint.retired or endpoint.in_flight >= endpoint.capacity or now < endpoint.busy_elsewhere_until:
                continue
            if endpoint.breaker.state(now) is BreakerState.HALF_OPEN and endpoint.breaker.allow(now):
                return endpoint
        return None

    def reserve(self, now: float, rows: int) -> Endpoint | None:
        """Choose an endpoint and take one of its slots (``choose`` then ``begin``)."""
        endpoint = self.choose(now, rows)
        if endpoint is not None:
            self.begin(endpoint, now, rows)
        return endpoint

    def begin(self, endpoint: Endpoint, now: float, rows: int | None = None) -> None:
        """A batch of ``rows`` real rows takes one of ``endpoint``'s slots now; it makes its
        calls there, one at a time, until it gives the slot back (``release``)."""
        endpoint.in_flight += 1
        endpoint.started.append((now, rows))
        self._last_pick[endpoint.url] = next(self._turn)

    def call_began(self, endpoint: Endpoint, held_since: float, now: float, rows: int | None = None) -> float:
        """The call on the slot held since ``held_since`` begins now, with ``rows`` real
        rows (None: as many as the slot was taken for): the endpoint is expected to free the
        fitted time of such a call from now. Returns the slot's new reference (what
        ``release`` and the next ``call_began`` take)."""
        index = _held(endpoint, held_since)
        if index is not None:
            endpoint.started[index] = (now, endpoint.started[index][1] if rows is None else rows)
        return now

    def observe_handoff(self, seconds: float) -> None:
        """A flushed batch reached its call after ``seconds`` (its tasks marked running, its
        slot leased, its rows padded): the hand-over the queueing slot must hide. Smoothed;
        one sample is capped at HANDOFF_SAMPLE_MAX_S, so an outage's wait does not stick."""
        sample = min(max(0.0, seconds), HANDOFF_SAMPLE_MAX_S) + self.handoff_margin_s
        self.handoff_s += HANDOFF_ALPHA * (sample - self.handoff_s)

    def record_call(
        self, endpoint: Endpoint, started_at: float, now: float, rows: int, transient_failure: bool
    ) -> None:
        """A call made on a slot of ``endpoint`` returned. ``transient_failure``: the
        endpoint did not answer (unreachable, timed out); any answer, a refusal included,
        means it serves."""
        if transient_failure:
            endpoint.failures += 1
            endpoint.breaker.record_failure(now)
            return
        endpoint.breaker.record_success()
        endpoint.calls += 1
        endpoint.rows += rows
        endpoint.call_time.observe(rows, max(0.0, now - started_at))

    def release(self, endpoint: Endpoint, held_since: float) -> None:
        """The slot held since ``held_since`` (taken then, or its call began then) is free again."""
        endpoint.in_flight = max(0, endpoint.in_flight - 1)
        index = _held(endpoint, held_since)
        if index is not None:
            del endpoint.started[index]

    def held_elsewhere(self, endpoint: Endpoint, now: float, until: float) -> None:
        """Other batchers hold every slot of ``endpoint``: count it full until ``until``.
        A probe ``choose`` let through for it is given back."""
        endpoint.busy_elsewhere_until = until
        if endpoint.breaker.state(now) is BreakerState.HALF_OPEN:
            endpoint.breaker.abort_probe()

    def healthy(self, now: float) -> bool:
        """Whether any endpoint's circuit is closed (else the batcher pauses consuming)."""
        return any(not e.retired and e.breaker.state(now) is BreakerState.CLOSED for e in self.endpoints.values())

    def capacity(self, now: float, batch_size: int) -> PoolCapacity:
        """Idle instances now (``free_slots``), when the next busy one should be ready for
        another batch, and a full call's time."""
        serving = [e for e in self.endpoints.values() if not e.retired and e.breaker.state(now) is BreakerState.CLOSED]
        if not serving:
            return PoolCapacity(0, self._initial_call_s, self._initial_call_s)
        call_time = min(e.call_time.predict(batch_size) for e in serving)
        idle = sum(min(e.open_slots(now), max(0, self.instances - e.in_flight)) for e in serving)
        if idle:
            return PoolCapacity(idle, 0.0, call_time)
        frees_at = []
        for e in serving:
            if now < e.busy_elsewhere_until:
                frees_at.append(e.busy_elsewhere_until)
            else:
                ends = [start + e.call_time.predict(batch_size if rows is None else rows) for start, rows in e.started]
                if e.open_slots(now):  # a queueing slot is free: take it just before an instance frees
                    ends = [end - self.handoff_s for end in ends]
                frees_at.extend(ends)
        next_free = min(frees_at) - now if frees_at else call_time
        return PoolCapacity(0, max(0.0, next_free), call_time)

    def summary(self, now: float, batch_size: int) -> list[dict[str, object]]:
        return [e.summary(now, batch_size) for _, e in sorted(self.endpoints.items())]


def _held(endpoint: Endpoint, since: float) -> int | None:
    """Where in ``endpoint.started`` the slot held since ``since`` is (None: not held)."""
    return next((index for index, (start, _) in enumerate(endpoint.started) if start == since), None)


SLOPE_MIN_T = 2.0  # standard errors a fitted slope must clear to count


class CallTimeFit:
    """Predicts the seconds of a call from its real rows."""

    def __init__(self, initial_s: float = 0.05, weight: float = 0.1) -> None:
        if not 0 < weight <= 1:
            raise ValueError("weight must be in (0, 1]")
        self._weight = weight
        # Exponentially weighted moments of rows (n) and seconds (t), and the sum of the
        # squared weights, which gives the effective number of calls behind them.
        self._w = self._w2 = self._n = self._t = self._nn = self._nt = self._tt = 0.0
        # Fitted once a call, read for every flush plan: the pool predicts on the hot path.
        self._line = (0.0, initial_s)

    def observe(self, rows: int, seconds: float) -> None:
        """A call of ``rows`` real rows took ``seconds``."""
        keep, weight = 1 - self._weight, self._weight
        self._w = keep * self._w + weight
        self._w2 = keep * keep * self._w2 + weight * weight
        self._n = keep * self._n + weight * rows
        self._t = keep * self._t + weight * seconds
        self._nn = keep * self._nn + weight * rows * rows
        self._nt = keep * self._nt + weight * rows * seconds
        self._tt = keep * self._tt + weight * seconds * seconds
        self._line = self._fit()

    def line(self) -> tuple[float, float]:
        """(a, b): seconds per row and seconds per call; a is never negative, and 0 unless
        the calls tell it from 0."""
        return self._line

    def _fit(self) -> tuple[float, float]:
        """The line through the moments, its slope kept only past SLOPE_MIN_T standard errors."""
        mean_n, mean_t = self._n / self._w, self._t / self._w
        variance = self._nn / self._w - mean_n * mean_n
        if variance < 1e-6:
            return 0.0, mean_t
        covariance = self._nt / self._w - mean_n * mean_t
        slope = covariance / variance
        calls = self._w * self._w / self._w2  # effective: recent calls weigh more
        if slope <= 0 or calls <= 2:
            return 0.0, mean_t
        residual = max(0.0, self._tt / self._w - mean_t * mean_t - slope * covariance)
        standard_error = math.sqrt(residual / (variance * (calls - 2)))
        if slope <= SLOPE_MIN_T * standard_error:
            return 0.0, mean_t
        return slope, max(0.0, mean_t - slope * mean_n)

    def predict(self, rows: int) -> float:
        """Expected seconds of a call carrying ``rows`` real rows."""
        slope, base = self.line()
        return slope * rows + base


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
