"""The endpoint pool and the call-time fit on a virtual clock: where calls go, what the
policy is told, how failures and removals move traffic. No I/O."""

from __future__ import annotations

import random

import pytest

from brimful.workers.endpoint_pool import BreakerState, CallTimeFit, CircuitBreaker, Endpoint, EndpointPool


def call_ended(p: EndpointPool, e: Endpoint, started_at: float, now: float, transient_failure: bool) -> None:
    """A 64-row call on a slot taken for it alone returned: its outcome, then the slot."""
    p.record_call(e, started_at, now, 64, transient_failure)
    p.release(e, started_at)


def pool(urls: list[str], capacity: int = 1) -> EndpointPool:
    p = EndpointPool(capacity, lambda: CircuitBreaker(3, 0.5, 5.0, rng=random.Random(1)), initial_call_s=0.02)
    p.sync(urls)
    return p


def test_the_fit_learns_a_line_and_a_constant_when_sizes_never_change() -> None:
    fit = CallTimeFit(initial_s=1.0, weight=0.2)
    assert fit.predict(64) == 1.0
    for _ in range(50):
        for rows in (8, 32, 64):
            fit.observe(rows, 0.010 + 0.0005 * rows)
    slope, base = fit.line()
    assert slope == pytest.approx(0.0005, rel=1e-3) and base == pytest.approx(0.010, rel=1e-3)
    constant = CallTimeFit()
    for _ in range(20):
        constant.observe(64, 0.02)
    assert constant.predict(1) == pytest.approx(0.02) and constant.predict(64) == pytest.approx(0.02)


def test_a_slope_the_calls_cannot_tell_from_zero_is_not_stretched_to_a_full_batch() -> None:
    """A GPU-like model: every call costs 30 ms whatever its rows, give or take 3 ms of
    noise. Seen only through thin calls (light load), the fit must not predict a full batch
    far above 30 ms; a real cost per row, as noisy, is still found."""
    rng = random.Random(7)
    flat, linear = CallTimeFit(), CallTimeFit()
    stretched = []
    for _ in range(2000):
        rows = rng.randint(1, 8)
        flat.observe(rows, 0.030 + rng.gauss(0, 0.003))
        linear.observe(rows * 8, 0.010 + 0.0005 * rows * 8 + rng.gauss(0, 0.003))
        stretched.append(flat.predict(64))
    stretched.sort()
    assert stretched[len(stretched) // 2] == pytest.approx(0.030, abs=0.002)  # the median prediction
    assert stretched[int(len(stretched) * 0.9)] < 0.036  # and nine in ten of them
    assert linear.predict(64) == pytest.approx(0.042, abs=0.006)


def test_calls_go_to_the_endpoint_expected_to_finish_soonest() -> None:
    p = pool(["a:1", "b:1"])
    for _ in range(20):  # a is slow, b fast
        call_ended(p, p.endpoints["a:1"], 0.0, 0.060, transient_failure=False)
        call_ended(p, p.endpoints["b:1"], 0.0, 0.020, transient_failure=False)
    assert p.choose(1.0, 64).url == "b:1"
    p.begin(p.endpoints["b:1"], 1.0)  # b is now full: a takes the next one
    assert p.choose(1.0, 64).url == "a:1"
    p.begin(p.endpoints["a:1"], 1.0)
    assert p.choose(1.0, 64) is None  # no endpoint is sent more than its capacity


def test_equal_endpoints_share_the_calls() -> None:
    p = pool(["a:1", "b:1", "c:1"], capacity=2)
    picks = []
    for i in range(30):
        endpoint = p.choose(float(i), 64)
        p.begin(endpoint, float(i))
        picks.append(endpoint.url)
        call_ended(p, endpoint, float(i), float(i) + 0.02, transient_failure=False)
    assert {url: picks.count(url) for url in set(picks)} == {"a:1": 10, "b:1": 10, "c:1": 10}


def test_an_endpoint_that_fails_loses_its_share_at_once_and_its_breaker_opens() -> None:
    p = pool(["a:1", "b:1"], capacity=4)
    a, b = p.endpoints["a:1"], p.endpoints["b:1"]
    p.begin(a, 0.0)
    call_ended(p, a, 0.0, 0.001, transient_failure=True)
    assert all(p.choose(0.002, 64) is b for _ in range(3))  # b has room: a gets nothing
    for _ in range(2):
        call_ended(p, a, 0.0, 0.003, transient_failure=True)
    assert a.breaker.state(0.003) is BreakerState.OPEN
    assert p.capacity(0.003, 64).free_slots == 4
    p.begin(b, 0.004)
    p.begin(b, 0.004)
    p.begin(b, 0.004)
    p.begin(b, 0.004)
    assert p.choose(0.004, 64) is None  # a is open and b is full
    assert p.healthy(0.004)


def test_an_open_endpoint_is_probed_by_one_call_when_its_breaker_allows() -> None:
    p = pool(["a:1"])
    a = p.endpoints["a:1"]
    for _ in range(3):
        call_ended(p, a, 0.0, 0.0, transient_failure=True)
    assert not p.healthy(0.0) and p.choose(0.0, 64) is None
    later = 10.0
    assert p.choose(later, 64) is a  # the probe
    p.held_elsewhere(a, later, later + 0.005)  # ... but another batcher held its slot
    assert p.choose(later + 0.01, 64) is a  # the probe was given back
    p.begin(a, later + 0.01)
    call_ended(p, a, later + 0.01, later + 0.03, transient_failure=False)
    assert p.healthy(later + 0.03)


def test_removed_endpoints_take_no_new_calls_and_leave_once_idle() -> None:
    p = pool(["a:1", "b:1"], capacity=2)
    a = p.endpoints["a:1"]
    p.begin(a, 0.0)
    added, retired = p.sync(["b:1", "c:1"])
    assert added == ["c:1"] and retired == ["a:1"]
    assert all(p.choose(0.0, 64).url != "a:1" for _ in range(5))
    assert p.drop_idle_retired() == []  # its call is still out
    call_ended(p, a, 0.0, 0.02, transient_failure=False)
    assert p.drop_idle_retired() == ["a:1"] and set(p.endpoints) == {"b:1", "c:1"}


def test_the_policy_is_told_free_slots_and_when_the_next_one_frees() -> None:
    p = pool(["a:1", "b:1"])
    for e in p.endpoints.values():
        for _ in range(30):
            e.call_time.observe(64, 0.020)
    assert p.capacity(0.0, 64).free_slots == 2
    p.begin(p.endpoints["a:1"], 1.000)
    p.begin(p.endpoints["b:1"], 1.005)
    view = p.capacity(1.010, 64)
    assert view.free_slots == 0
    assert view.next_free_in == pytest.approx(0.010)  # a's call, started at 1.000, ends at 1.020
    assert view.call_time == pytest.approx(0.020)
    p.held_elsewhere(p.endpoints["b:1"], 1.01, 1.012)
    call_ended(p, p.endpoints["b:1"], 1.005, 1.011, transient_failure=False)
    assert p.capacity(1.011, 64).free_slots == 0  # b is free here but leased by another batcher
    assert p.capacity(1.013, 64).free_slots == 1


def test_a_queueing_slot_is_offered_just_before_the_running_call_ends() -> None:
    """One instance, two slots: while a call runs the policy is told the endpoint is busy
    (the next batch keeps filling) until just before that call should end."""
    p = EndpointPool(2, lambda: CircuitBreaker(rng=random.Random(1)), initial_call_s=0.02, instances=1, handoff_s=0.003)
    p.sync(["a:1"])
    a = p.endpoints["a:1"]
    for _ in range(30):
        a.call_time.observe(64, 0.020)
    assert p.capacity(0.0, 64).free_slots == 1
    p.begin(a, 1.000)
    view = p.capacity(1.005, 64)
    assert view.free_slots == 0 and view.next_free_in == pytest.approx(0.012)  # 1.020 - 0.003 - 1.005
    assert p.choose(1.005, 64) is a  # the queueing slot is there when the policy sends a batch to it
    p.begin(a, 1.017)
    view = p.capacity(1.018, 64)
    assert view.free_slots == 0 and view.next_free_in == pytest.approx(0.002)  # both slots held: the first call's end
    assert p.choose(1.018, 64) is None
    with pytest.raises(ValueError):
        EndpointPool(1, CircuitBreaker, instances=2)


def test_the_running_call_is_expected_to_end_a_call_time_after_it_began_and_the_handover_is_measured() -> None:
    """The slot is taken at the flush, the call begins after the batch's tasks are marked
    running and its lease taken: the endpoint frees a fitted call time after the call began,
    and the queueing slot is offered that hand-over (measured, smoothed, plus a margin) before."""
    p = EndpointPool(
        2,
        lambda: CircuitBreaker(rng=random.Random(1)),
        initial_call_s=0.02,
        instances=1,
        handoff_s=0.003,
        handoff_margin_s=0.001,
    )
    p.sync(["a:1"])
    a = p.endpoints["a:1"]
    for _ in range(30):
        a.call_time.observe(64, 0.020)
    p.begin(a, 1.000)  # flushed: the slot is taken
    assert p.capacity(1.001, 64).next_free_in == pytest.approx(0.016)  # planned from the take until the call begins
    held = p.call_began(a, 1.000, 1.004)
    assert held == 1.004
    assert p.capacity(1.005, 64).next_free_in == pytest.approx(0.016)  # 1.004 + 0.020 - 0.003 - 1.005
    for _ in range(100):
        p.observe_handoff(0.004)
    assert p.handoff_s == pytest.approx(0.005, abs=1e-4)
    assert p.capacity(1.005, 64).next_free_in == pytest.approx(0.014, abs=1e-4)
    p.observe_handoff(30.0)  # a batch that waited out an outage: one capped sample
    assert p.handoff_s < 0.005 + 0.1 * 0.05 + 1e-9
    p.release(a, held)
    assert a.in_flight == 0 and not a.started


def test_a_thin_running_call_is_expected_to_end_at_its_own_fitted_time_not_a_full_batchs() -> None:
    """At light load the fit sees only thin calls, and whatever slope they show, a full batch
    stretches it far: the running call's end is planned from its rows."""
    p = EndpointPool(2, lambda: CircuitBreaker(rng=random.Random(1)), initial_call_s=0.02, instances=1, handoff_s=0.0)
    p.sync(["a:1"])
    a = p.endpoints["a:1"]
    for _ in range(30):
        for rows, seconds in ((2, 0.029), (6, 0.031)):  # 0.5 ms a row: 60 more rows, 30 ms more
            a.call_time.observe(rows, seconds)
    assert a.call_time.predict(64) == pytest.approx(0.060)
    p.begin(a, 1.000, rows=4)  # taken for four rows
    assert p.capacity(1.000, 64).next_free_in == pytest.approx(0.030)
    held = p.call_began(a, 1.000, 1.002, rows=2)  # the call carries two (two were cancelled meanwhile)
    assert p.capacity(1.002, 64).next_free_in == pytest.approx(0.029)
    p.begin(a, 1.003)  # rows not known: planned as a full batch
    assert p.capacity(1.003, 64).next_free_in == pytest.approx(0.028)  # the thin call still ends first
    p.release(a, held)
    assert p.capacity(1.003, 64).next_free_in == pytest.approx(0.060)
