"""The simulator replays traces through the same policy objects the live batcher uses."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from brimful.batcher import traces
from brimful.batcher.simulator import PoolModel, simulate
from brimful.core.policy_params import PolicyParams
from brimful.core.policy_tuning import TuningError, apply_changes

PARAMS = PolicyParams(batch_size=64, max_wait=0.25, min_wait=0.02)


def test_dense_traffic_makes_full_batches() -> None:
    trace = traces.poisson(rate=4000, duration=5, seed=1)
    result = simulate(trace, PARAMS, PoolModel(call_s=0.005))
    assert result.rows == len(trace[0])
    assert result.mean_rows_per_batch > 63.5
    assert result.flushes["full"] >= result.batches - 1
    assert result.wait_quantile(0.99) < 0.05  # 64 rows at 4,000/s arrive in 16 ms


def test_a_trickle_is_flushed_row_by_row_on_the_short_deadline() -> None:
    trace = {0: [i * 1.0 for i in range(20)]}  # one row a second
    result = simulate(trace, PARAMS)
    assert result.batches == 20
    assert result.mean_rows_per_batch == 1
    assert result.wait_quantile(1.0) == pytest.approx(PARAMS.min_wait)
    assert result.padded_share == pytest.approx(63 / 64)


def test_no_row_waits_past_max_wait_in_replay() -> None:
    trace = traces.bursty(rate_on=3000, rate_off=30, period=2, duty=0.3, duration=20, partitions=2, seed=3)
    result = simulate(trace, PARAMS)
    assert result.rows == sum(len(t) for t in trace.values())
    assert max(result.waits_s) <= PARAMS.max_wait + 1e-9


def test_a_busy_model_holds_batches_back_and_they_fill_meanwhile() -> None:
    trace = traces.poisson(rate=1000, duration=5, seed=2)
    idle = simulate(trace, PolicyParams(batch_size=64, max_wait=0.01, min_wait=0.01), PoolModel(call_s=0.001))
    busy = simulate(
        trace, PolicyParams(batch_size=64, max_wait=0.01, min_wait=0.01), PoolModel(slots_per_endpoint=1, call_s=0.05)
    )
    assert busy.mean_rows_per_batch > idle.mean_rows_per_batch
    assert busy.batches < idle.batches


def test_knowing_the_pool_answers_light_load_sooner_and_fills_as_well_under_load() -> None:
    """The pool-aware policy beside the EWMA timer on the same traces and the same GPU-like
    pool (one endpoint, one slot, 20 ms a call)."""
    pool = PoolModel(endpoints=1, slots_per_endpoint=1, call_s=0.020)
    params = PolicyParams(batch_size=64)
    light = traces.poisson(rate=100, duration=30, seed=7)
    aware, timer = simulate(light, params, pool, aware=True), simulate(light, params, pool, aware=False)
    assert aware.latency_quantile(0.5) < timer.latency_quantile(0.5) - 0.02
    assert aware.latency_quantile(0.99) <= params.latency_target + 0.02  # a call at most behind its target
    heavy = traces.poisson(rate=2400, duration=30, seed=7)  # 75% of 64 rows / 20 ms
    aware, timer = simulate(heavy, params, pool, aware=True), simulate(heavy, params, pool, aware=False)
    assert aware.mean_rows_per_batch >= 0.95 * timer.mean_rows_per_batch
    assert aware.latency_quantile(0.99) <= timer.latency_quantile(0.99) * 1.05


def test_four_endpoints_drain_four_times_the_rows_of_one() -> None:
    backlog = {0: [0.0] * 20_000}  # everything already waiting: a drain
    params = PolicyParams(batch_size=64)
    one = simulate(backlog, params, PoolModel(endpoints=1, slots_per_endpoint=1, call_s=0.02))
    four = simulate(backlog, params, PoolModel(endpoints=4, slots_per_endpoint=1, call_s=0.02))
    drained = [max(r.latencies_s) for r in (one, four)]
    assert one.mean_rows_per_batch > 63 and four.mean_rows_per_batch > 63
    assert drained[0] / drained[1] == pytest.approx(4, rel=0.02)


def test_generated_traces_have_their_rates(tmp_path: Path) -> None:
    poisson = traces.poisson(rate=500, duration=20, partitions=4, seed=5)
    assert sum(len(t) for t in poisson.values()) == pytest.approx(10_000, rel=0.05)
    assert all(len(t) == pytest.approx(2500, rel=0.1) for t in poisson.values())
    bursty = traces.bursty(rate_on=1000, rate_off=0, period=10, duty=0.5, duration=20, seed=5)
    arrivals = bursty[0]
    assert all((t % 10) < 5 for t in arrivals)  # nothing arrives while off
    assert len(arrivals) == pytest.approx(10_000, rel=0.05)
    ramp = traces.ramp(rate_from=0, rate_to=1000, duration=10, seed=5)[0]
    first_half = sum(1 for t in ramp if t < 5)
    assert first_half == pytest.approx(len(ramp) / 4, rel=0.1)  # integral of a linear ramp


def test_traces_round_trip_through_parquet_files_and_directories(tmp_path: Path) -> None:
    trace = traces.poisson(rate=100, duration=5, partitions=3, seed=7)
    traces.write_trace(trace, tmp_path / "one.parquet")
    assert traces.read_trace(tmp_path / "one.parquet") == trace
    recorder = traces.ArrivalRecorder(tmp_path / "recorded", member="m")
    for partition, times in trace.items():
        for t in times:
            recorder.record(partition, t)
    assert recorder.flush() is not None
    recorder.record(0, 99.0)
    assert recorder.flush() is not None
    assert recorder.flush() is None  # nothing new
    recorded = traces.read_trace(tmp_path / "recorded")
    assert recorded[0] == sorted(trace[0] + [99.0])
    assert recorded[1] == trace[1]


def test_policy_changes_are_validated_as_a_whole() -> None:
    current = {
        "max_wait_ms": 250.0,
        "min_wait_ms": 20.0,
        "latency_target_ms": 50.0,
        "rate_halflife_ms": 500.0,
        "fill_slack": 1.25,
        "min_worthwhile_rows": 4.0,
        "low_max_wait_ms": 30000.0,
    }
    assert apply_changes(current, {"max_wait_ms": "100"}, 64)["max_wait_ms"] == 100.0
    with pytest.raises(TuningError, match="min_wait"):
        apply_changes(current, {"max_wait_ms": 10}, 64)
    with pytest.raises(TuningError, match=r"unknown parameter.*batch_size"):
        apply_changes(current, {"batch_size": 32}, 64)
    with pytest.raises(TuningError, match="must be a number"):
        apply_changes(current, {"max_wait_ms": "soon"}, 64)
    with pytest.raises(TuningError, match="finite"):
        apply_changes(current, {"max_wait_ms": "inf"}, 64)
    with pytest.raises(TuningError, match="above its limit"):
        apply_changes(current, {"max_wait_ms": 6.9e16}, 64)
    with pytest.raises(TuningError, match="no parameters"):
        apply_changes(current, {}, 64)


def test_the_time_around_a_batch_counts_against_the_target_as_it_does_live() -> None:
    """What a task spends outside its batch and call (``around_s``) is part of its
    submit-to-result time and comes out of what its batch may wait, as the live batcher
    counts it: so a replay chooses a target that holds live."""
    trace = traces.poisson(rate=600, duration=20, seed=3)
    params = PolicyParams(batch_size=64, latency_target=0.080)
    pool = PoolModel(endpoints=1, slots_per_endpoint=2, call_s=0.020)
    bare, around = simulate(trace, params, pool), simulate(trace, params, replace(pool, around_s=0.015))
    assert around.wait_quantile(0.99) <= bare.wait_quantile(0.99) - 0.010  # the path's time is not the batch's to wait
    assert around.latency_quantile(0.99) == pytest.approx(bare.latency_quantile(0.99), abs=0.005)  # it is the task's
    assert around.latency_quantile(0.99) <= params.latency_target


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_burst_in_the_cost_mode_makes_full_calls_but_the_last_of_each_partition(partitions: int) -> None:
    # 2,000 tasks at 700/s on a GPU-like pool (20 ms a call, two slots), target raised to 3 s.
    trace = traces.poisson(700.0, 2000 / 700.0, partitions=partitions, seed=7)
    pool = PoolModel(endpoints=1, slots_per_endpoint=2, call_s=0.020, around_s=0.010)
    cost = simulate(trace, PolicyParams(batch_size=64, latency_target=3.0), pool)
    fewest = sum(math.ceil(len(times) / 64) for times in trace.values())
    assert cost.batches == fewest, cost.flushes
    assert cost.flushes["slot_free"] == 0
    # The default target answers the same burst sooner, in more calls.
    default = simulate(trace, PolicyParams(batch_size=64), pool)
    assert default.batches > cost.batches
    assert default.latency_quantile(0.5) < cost.latency_quantile(0.5)
