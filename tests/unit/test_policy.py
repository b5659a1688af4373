"""The wait-or-full policy on a virtual clock: no I/O, no real time."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brimful.batcher.accumulator import Accumulator, Pending
from brimful.batcher.policy import ArrivalRate, FlushReason, WaitOrFullPolicy
from brimful.core.policy_params import PolicyParams

PARAMS = PolicyParams(batch_size=64, max_wait=0.250, min_wait=0.020, rate_halflife=0.5, min_worthwhile_rows=4)


def accumulator(params: PolicyParams = PARAMS) -> Accumulator[int]:
    return Accumulator(WaitOrFullPolicy(params))


def run_until_flush(
    acc: Accumulator[int], start: float, arrival_gap: float | None, limit: float = 10.0
) -> tuple[float, FlushReason, int]:
    """Step a virtual clock in 1 ms ticks, adding a row every ``arrival_gap`` seconds,
    until the accumulator is due. Returns (time, reason, rows)."""
    now = start
    next_arrival = start + arrival_gap if arrival_gap else math.inf
    while now < start + limit:
        if now >= next_arrival:
            acc.add(len(acc), now)
            next_arrival += arrival_gap  # type: ignore[operator]
        reason = acc.due(now)
        if reason is not None:
            return now, reason, len(acc)
        now = round(now + 0.001, 6)
    raise AssertionError("never flushed")


def test_zero_rate_flushes_a_lone_request_after_min_wait() -> None:
    acc = accumulator()
    acc.add(0, 100.0)
    at, reason, rows = run_until_flush(acc, 100.0, None)
    assert reason is FlushReason.DEADLINE
    assert rows == 1
    assert at == pytest.approx(100.0 + PARAMS.min_wait, abs=0.0011)


def test_full_batch_flushes_at_once() -> None:
    acc = accumulator()
    for i in range(64):
        acc.add(i, 5.0)
    assert acc.due(5.0) is FlushReason.FULL
    assert len(acc.take()) == 64
    assert len(acc) == 0


def test_take_never_returns_more_than_the_batch_size() -> None:
    acc = accumulator()
    for i in range(150):
        acc.add(i, 1.0)
    assert [len(acc.take()) for _ in range(3)] == [64, 64, 22]


def test_steady_traffic_that_fills_in_time_waits_for_a_full_batch() -> None:
    acc = accumulator()
    # 1,000 req/s for a second to warm the estimate, flushing as it goes.
    now = 0.0
    for i in range(1000):
        acc.add(i, now)
        if acc.due(now):
            acc.take()
        now += 0.001
    acc.drain()
    _at, reason, rows = run_until_flush(acc, now, 0.001)
    assert reason is FlushReason.FULL
    assert rows == 64


def test_burst_after_silence_stops_flushing_single_rows() -> None:
    acc = accumulator()
    acc.add(0, 0.0)
    _, reason, rows = run_until_flush(acc, 0.0, None)
    assert rows == 1  # the first row of a burst cannot know one follows
    acc.take()
    # A burst at 2,000 req/s: within a few rows the estimate says the batch will fill.
    _, reason, rows = run_until_flush(acc, 0.03, 0.0005)
    assert reason is FlushReason.FULL and rows == 64


def test_sudden_drop_does_not_hold_rows_for_traffic_that_stopped() -> None:
    acc = accumulator()
    now = 0.0
    for i in range(2000):  # 2 s at 1,000 req/s
        acc.add(i, now)
        if acc.due(now):
            acc.take()
        now += 0.001
    acc.drain()
    # Traffic drops to one row every 400 ms: each is flushed on the short deadline.
    for _ in range(5):
        now += 0.4
        acc.add(0, now)
        at, _reason, rows = run_until_flush(acc, now, None)
        assert rows == 1
        assert at - now <= PARAMS.min_wait + 0.0011
        acc.take()
        now = at


def test_thin_but_worthwhile_traffic_waits_up_to_max_wait() -> None:
    # 40 req/s: a batch will not fill within max_wait, but waiting gathers ~10 rows.
    acc = accumulator()
    at = 0.0
    while at < 2.0:  # two seconds for the estimate to learn the rate
        at, reason, rows = run_until_flush(acc, at, 0.025)
        acc.take()
    start = at
    at, reason, rows = run_until_flush(acc, at, 0.025)
    assert reason is FlushReason.DEADLINE
    assert rows >= 8
    first_arrival = start + 0.025
    assert at - first_arrival <= PARAMS.max_wait + 0.0011


def test_request_deadline_flushes_early() -> None:
    acc = accumulator()
    for i in range(10):
        acc.add(i, 0.0)
    acc.add(10, 0.0, flush_by=0.010)
    plan = acc.plan(0.0)
    assert plan is not None and plan.reason is FlushReason.REQUEST_DEADLINE and plan.at == 0.010
    assert acc.due(0.009) is None
    assert acc.due(0.010) is FlushReason.REQUEST_DEADLINE


def test_parameters_changed_while_a_batch_fills_apply_to_the_waiting_rows() -> None:
    acc = accumulator(PolicyParams(batch_size=64, max_wait=5.0, min_wait=1.0, rate_halflife=0.5))
    acc.add(0, 0.0)
    assert acc.due(0.5) is None  # min_wait of 1 s holds it
    acc.set_params(PolicyParams(batch_size=64, max_wait=0.2, min_wait=0.1, rate_halflife=0.5))
    assert acc.due(0.5) is FlushReason.DEADLINE  # already past the new short deadline
    acc.take()
    acc.set_params(PolicyParams(batch_size=8, max_wait=0.2, min_wait=0.1, rate_halflife=0.5))
    for i in range(8):
        acc.add(i, 1.0)
    assert acc.due(1.0) is FlushReason.FULL  # a smaller batch size counts at once


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(st.floats(min_value=0.0, max_value=0.5, allow_nan=False), min_size=1, max_size=300),
    max_wait=st.floats(min_value=0.01, max_value=1.0),
)
def test_no_row_waits_past_max_wait(gaps: list[float], max_wait: float) -> None:
    params = PolicyParams(batch_size=64, max_wait=max_wait, min_wait=min(0.005, max_wait), rate_halflife=0.5)
    policy = WaitOrFullPolicy(params)
    acc: Accumulator[int] = Accumulator(policy)
    now = 0.0
    for gap in gaps:
        # Before the next arrival, check at the plan's own time: the flush never comes late.
        plan = acc.plan(now)
        while plan is not None and plan.at <= now + gap:
            oldest = acc.oldest_arrival
            assert oldest is not None and plan.at - oldest <= max_wait + 1e-9
            acc.take()
            plan = acc.plan(plan.at)
        now += gap
        acc.add(0, now)


def test_rate_estimate_tracks_a_steady_stream() -> None:
    rate = ArrivalRate(halflife=0.5)
    now = 0.0
    for _ in range(5000):
        now += 0.002
        rate.observe(now)
    assert rate.rate(now + 0.001) == pytest.approx(500, rel=0.1)


def test_rate_estimate_decays_to_zero_when_arrivals_stop() -> None:
    rate = ArrivalRate(halflife=0.5)
    for i in range(100):
        rate.observe(i * 0.01)
    assert rate.rate(0.99) > 50
    assert rate.rate(60.0) < 0.1


def test_invalid_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="min_wait"):
        PolicyParams(max_wait=0.1, min_wait=0.2)
    with pytest.raises(ValueError, match="batch_size"):
        PolicyParams(batch_size=0)
    with pytest.raises(ValueError, match="fill_slack"):
        PolicyParams(fill_slack=0.5)


def test_waiting_mode_has_hysteresis_around_the_worthwhile_threshold() -> None:
    policy = WaitOrFullPolicy(PARAMS)  # threshold: 4 rows in 250 ms = 16 req/s; half: 8 req/s
    assert not policy.is_patient(rate=12, was_patient=False)  # a cold partition does not start waiting
    assert policy.is_patient(rate=12, was_patient=True)  # a waiting one keeps waiting through a dip
    assert not policy.is_patient(rate=7, was_patient=True)  # until the gain halves
    assert policy.is_patient(rate=16, was_patient=False)
    assert policy.wait_budget(1, rate=12, waited=0.0, patient=True) == PARAMS.max_wait
    assert policy.wait_budget(1, rate=12, waited=0.0, patient=False) == PARAMS.min_wait


def test_rows_of_one_fetch_count_as_that_many_arrivals_and_keep_their_order() -> None:
    one_by_one, together = accumulator(), accumulator()
    for acc in (one_by_one, together):
        acc.add(0, 0.0, stamp=0.0)
    stamps = [0.010 + 0.001 * n for n in range(10)]
    for number, stamp in enumerate(stamps, start=1):
        one_by_one.add(number, 0.02, stamp=stamp)
    together.add_many([Pending(number, 0.02, None, stamp) for number, stamp in enumerate(stamps, start=1)], 0.02)
    assert together.rate.rate(0.02) == pytest.approx(one_by_one.rate.rate(0.02))
    assert together.effective_rate(0.02) == pytest.approx(one_by_one.effective_rate(0.02))
    assert together.patient and one_by_one.patient  # ten rows in 10 ms: waiting pays
    assert [row.item for row in together.take()] == [row.item for row in one_by_one.take()] == list(range(11))
