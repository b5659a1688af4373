"""The pool-aware flush policy on a virtual clock: what it does with free and busy slots
and the latency target. No I/O, no real time."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brimful.batcher.accumulator import Accumulator
from brimful.batcher.policy import FlushReason, WaitOrFullPolicy
from brimful.core.policy_params import PolicyParams
from brimful.core.pool_capacity import PoolCapacity

PARAMS = PolicyParams(batch_size=64, max_wait=0.250, min_wait=0.002, latency_target=0.050, min_worthwhile_rows=4)
CALL = 0.020
FREE = PoolCapacity(free_slots=1, next_free_in=0.0, call_time=CALL)


def busy(next_free_in: float) -> PoolCapacity:
    return PoolCapacity(free_slots=0, next_free_in=next_free_in, call_time=CALL)


def steady(acc: Accumulator[int], rate: float, until: float, start: float = 0.0) -> float:
    """Warm the rate estimate with ``rate`` rows/s until ``until``, emptying as it goes."""
    now, gap = start, 1 / rate
    while now < until:
        acc.add(0, now)
        now += gap
    acc.drain()
    return now


def test_a_lone_row_with_a_free_slot_leaves_after_min_wait() -> None:
    acc: Accumulator[int] = Accumulator(WaitOrFullPolicy(PARAMS))
    acc.add(0, 10.0)
    assert acc.due(10.0, FREE) is None  # not before min_wait
    assert acc.due(10.0 + PARAMS.min_wait, FREE) is FlushReason.SLOT_FREE


def test_thin_traffic_is_not_held_for_rows_that_will_not_come() -> None:
    acc: Accumulator[int] = Accumulator(WaitOrFullPolicy(PARAMS))
    now = steady(acc, rate=20.0, until=5.0)  # 20/s x 28 ms left = 0.6 rows: waiting does not pay
    acc.add(1, now)
    plan = acc.plan(now, FREE)
    assert plan is not None and plan.reason is FlushReason.SLOT_FREE
    assert plan.at == pytest.approx(now + PARAMS.min_wait)


def test_traffic_that_pays_waits_for_rows_but_not_past_the_target() -> None:
    acc: Accumulator[int] = Accumulator(WaitOrFullPolicy(PARAMS))
    now = steady(acc, rate=600.0, until=5.0)  # 600/s x 28 ms = 17 rows: worth waiting; 64 will not come
    acc.add(1, now)
    plan = acc.plan(now, FREE)
    assert plan is not None and plan.reason is FlushReason.TARGET
    assert plan.at == pytest.approx(now + PARAMS.latency_target - CALL)


def test_the_time_a_task_spends_around_its_batch_comes_out_of_its_wait() -> None:
    around = 0.012  # measured: submit to batcher, and call end to stored result
    acc: Accumulator[int] = Accumulator(WaitOrFullPolicy(PARAMS))
    now = steady(acc, rate=600.0, until=5.0)
    acc.add(1, now)
    plan = acc.plan(now, PoolCapacity(free_slots=1, next_free_in=0.0, call_time=CALL, around_call=around))
    assert plan is not None and plan.reason is FlushReason.TARGET
    assert plan.at == pytest.approx(now + PARAMS.latency_target - CALL - around)
    # When what is left of the target would gather too few rows, nothing waits at all.
    acc.drain()
    now = steady(acc, rate=300.0, until=10.0, start=now)  # 300/s x 28 ms = 8.4 rows; x 16 ms = 4.8
    acc.add(1, now)
    crowded = PoolCapacity(free_slots=1, next_free_in=0.0, call_time=CALL, around_call=0.020)  # 10 ms left: 3 rows
    plan = acc.plan(now, crowded)
    assert plan is not None and plan.reason is FlushReason.SLOT_FREE
    assert plan.at == pytest.approx(now + PARAMS.min_wait)


def test_traffic_that_fills_the_batch_in_time_waits_for_it_to_fill() -> None:
    acc: Accumulator[int] = Accumulator(WaitOrFullPolicy(PARAMS))
    now = steady(acc, rate=10_000.0, until=2.0)
    gap, leaving = 1e-4, None
    for i in range(64):
        acc.add(i, now)
        leaving = acc.due(now, FREE)
        if leaving is not None:
            break
        now += gap
    assert leaving is FlushReason.FULL and len(acc) == 64


def test_while_every_slot_is_busy_the_batch_keeps_filling_and_leaves_when_one_frees() -> None:
    acc: Accumulator[int] = Accumulator(WaitOrFullPolicy(PARAMS))
    now = steady(acc, rate=20.0, until=5.0)  # thin: a free slot would take a row at once
    acc.add(0, now)
    frees_at = now + 0.015
    t = now
    while t < frees_at - 1e-9:
        assert acc.due(t, busy(frees_at - t)) is None
        t += 0.001
    plan = acc.plan(now, busy(frees_at - now))
    assert plan is not None and plan.at == pytest.approx(frees_at)
    assert acc.due(frees_at, FREE) is FlushReason.SLOT_FREE


def test_without_a_pool_the_ewma_timer_decides_as_before() -> None:
    policy = WaitOrFullPolicy(PARAMS)
    with_timer = policy.plan(now=1.0, pending=1, oldest_arrival=1.0, rate=0.0)
    assert with_timer.reason is FlushReason.DEADLINE and with_timer.at == pytest.approx(1.0 + PARAMS.min_wait)


COST_MODE = PolicyParams(batch_size=64, max_wait=2.0, min_wait=0.002, latency_target=2.0)


def test_a_high_target_is_the_cost_mode_it_waits_to_fill() -> None:
    assert COST_MODE.fill_first and not PARAMS.fill_first
    acc: Accumulator[int] = Accumulator(WaitOrFullPolicy(COST_MODE))
    now = steady(acc, rate=100.0, until=5.0)
    acc.add(0, now)
    plan = acc.plan(now, FREE)
    # Not the moment the batch is expected full (63 slots at 100/s x slack): if the rows come
    # slower than that, leaving then is a short call; it leaves full or at its latest.
    assert plan is not None and plan.reason is FlushReason.TARGET
    assert plan.at == pytest.approx(now + COST_MODE.latency_target - CALL)
    for _ in range(63):
        now += 0.01
        acc.add(0, now)
    assert acc.due(now, FREE) is FlushReason.FULL


def test_in_the_cost_mode_a_burst_s_first_row_waits_though_the_rate_is_not_yet_known() -> None:
    # Cold: nothing arrived for a minute, so the rate reads zero and no wait looks worthwhile.
    acc: Accumulator[int] = Accumulator(WaitOrFullPolicy(COST_MODE))
    steady(acc, rate=10.0, until=1.0)
    acc.add(0, 60.0)
    assert acc.effective_rate(60.0) < 1
    assert acc.due(60.0 + COST_MODE.min_wait, FREE) is None
    assert acc.patient
    plan = acc.plan(60.0, FREE)
    assert plan is not None and plan.at == pytest.approx(60.0 + COST_MODE.latency_target - CALL)
    # Outside the cost mode the same row leaves once a slot is free, as a lone row should.
    lone: Accumulator[int] = Accumulator(WaitOrFullPolicy(PARAMS))
    lone.add(0, 60.0)
    assert lone.due(60.0 + PARAMS.min_wait, FREE) is FlushReason.SLOT_FREE


def test_the_cost_mode_never_waits_past_max_wait_nor_a_row_s_own_deadline() -> None:
    params = PolicyParams(batch_size=64, max_wait=0.5, min_wait=0.002, latency_target=3.0)
    acc: Accumulator[int] = Accumulator(WaitOrFullPolicy(params))
    acc.add(0, 1.0)
    plan = acc.plan(1.0, FREE)
    assert plan is not None and (plan.at, plan.reason) == (pytest.approx(1.5), FlushReason.DEADLINE)
    acc.add(1, 1.1, flush_by=1.2)
    plan = acc.plan(1.1, FREE)
    assert plan is not None and (plan.at, plan.reason) == (pytest.approx(1.2), FlushReason.REQUEST_DEADLINE)


arrival_gaps = st.lists(st.floats(min_value=1e-5, max_value=0.2), min_size=1, max_size=300)


@settings(max_examples=150, deadline=None)
@given(
    gaps=arrival_gaps,
    target_ms=st.floats(min_value=5, max_value=500),
    call_ms=st.floats(min_value=0, max_value=100),
    around_ms=st.floats(min_value=0, max_value=100),
    worthwhile=st.floats(min_value=0, max_value=64),
)
def test_no_row_waits_past_the_latency_target_when_capacity_allows(
    gaps: list[float], target_ms: float, call_ms: float, around_ms: float, worthwhile: float
) -> None:
    """Submit to result: the row's wait, its call and the time around them (to the batcher,
    to the stored result) stay within the target, as far as min_wait allows."""
    params = PolicyParams(
        batch_size=64, max_wait=1.0, min_wait=0.002, latency_target=target_ms / 1000, min_worthwhile_rows=worthwhile
    )
    capacity = PoolCapacity(free_slots=4, next_free_in=0.0, call_time=call_ms / 1000, around_call=around_ms / 1000)
    allowed = min(
        params.max_wait, max(params.min_wait, params.latency_target - capacity.call_time - capacity.around_call)
    )
    acc: Accumulator[int] = Accumulator(WaitOrFullPolicy(params))
    arrivals = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    tick, now, index = 0.0005, 0.0, 0
    while index < len(arrivals) or len(acc):
        while index < len(arrivals) and arrivals[index] <= now:
            acc.add(index, arrivals[index])
            index += 1
        while acc.due(now, capacity) is not None:
            for row in acc.take():
                assert now - row.arrived_at <= allowed + tick + 1e-9, (now, row.arrived_at, allowed)
        now += tick


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(min_value=0, max_value=5_000),
    pending=st.integers(min_value=1, max_value=63),
    waited=st.floats(min_value=0, max_value=0.3),
    target_ms=st.floats(min_value=5, max_value=500),
)
def test_a_free_slot_and_a_row_past_its_wait_is_never_left_waiting(
    rate: float, pending: int, waited: float, target_ms: float
) -> None:
    """When a slot is free and the oldest row has waited min_wait, the batch leaves now
    unless waiting until the target is expected to bring min_worthwhile_rows more."""
    params = PolicyParams(batch_size=64, max_wait=1.0, min_wait=0.002, latency_target=target_ms / 1000)
    policy = WaitOrFullPolicy(params)
    now = 100.0
    oldest = now - waited
    plan = policy.plan(now, pending, oldest, rate, capacity=FREE)
    latest, _ = policy.latest_flush(oldest, CALL)
    pays = rate * max(0.0, latest - now) >= params.min_worthwhile_rows
    if waited >= params.min_wait and not pays:
        assert plan.at <= now and plan.reason in (FlushReason.SLOT_FREE, FlushReason.TARGET, FlushReason.DEADLINE)
    if now >= latest:
        assert plan.at <= now
    assert plan.at <= max(now, latest) + 1e-9
    assert not math.isnan(plan.at)


# What a live batcher's /status showed with the GPU-like model on the benchmark machine:
# its calls' time, and the time a task spent around its batch (submit to batcher, call end
# to stored result), which grows with load. They are the defaults' reason to be
# (docs/batching.md).


def plan_at_defaults(rate: float, call: float, around: float) -> tuple[float, FlushReason, PolicyParams]:
    """Where a fresh row's batch is planned to leave, with a free slot, at ``rate``."""
    params = PolicyParams()
    acc: Accumulator[int] = Accumulator(WaitOrFullPolicy(params))
    now = steady(acc, rate=rate, until=5.0)
    acc.add(1, now)
    plan = acc.plan(now, PoolCapacity(free_slots=1, next_free_in=0.0, call_time=call, around_call=around))
    assert plan is not None
    return plan.at - now, plan.reason, params


def test_the_defaults_send_a_thin_stream_to_an_idle_model_at_once() -> None:
    # 90/s: the ~63 ms a 105 ms target leaves would bring ~6 rows, under 8.
    delay, reason, params = plan_at_defaults(90.0, call=0.031, around=0.011)
    assert reason is FlushReason.SLOT_FREE
    assert delay == pytest.approx(params.min_wait)


def test_the_defaults_let_a_batch_fill_at_mid_load() -> None:
    # 450/s: the ~49 ms the target leaves would bring ~22 rows, so the batch waits for them.
    delay, reason, params = plan_at_defaults(450.0, call=0.034, around=0.022)
    assert reason is FlushReason.TARGET
    assert delay == pytest.approx(params.latency_target - 0.034 - 0.022)
