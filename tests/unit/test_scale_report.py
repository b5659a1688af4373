"""The scale benchmark's configurations and what its report derives from them."""

from __future__ import annotations

import pytest

from bench.scale import Shape, render, role_of, worst_second


def test_a_configuration_is_four_counts_of_at_least_one() -> None:
    assert Shape.parse("2x1x4X2") == Shape(api_workers=2, batchers=1, partitions=4, endpoints=2)
    assert str(Shape.parse("2x1x4x2")) == "2x1x4x2"
    for bad in ("2x1x4", "0x1x1x1", "ax1x1x1", "1x1x1x1x1"):
        with pytest.raises(ValueError, match="WxBxPxE"):
            Shape.parse(bad)


def test_processes_are_counted_by_role() -> None:
    assert [role_of(name) for name in ("api", "batcher-0", "batcher-1", "triton", "triton-1", "broker", "redis")] == [
        "api",
        "batcher",
        "batcher",
        "model",
        "model",
        "broker",
        "redis",
    ]


def _run(config: str, rows_per_s: float) -> dict[str, object]:
    return {
        "config": config,
        "rows_per_s": rows_per_s,
        "cpu_us_per_task": {"api": 400.0, "batcher": 150.0},
        "open_offered": 0.8 * rows_per_s,
        "open_rows_per_s": 0.79 * rows_per_s,
        "open_p50_ms": 50.0,
        "open_p99_ms": 90.0,
    }


def test_the_report_gives_each_added_process_its_share_of_the_gain() -> None:
    results = {
        "command": "python -m bench.scale",
        "machine": "x86_64",
        "seconds": 10.0,
        "runs": [
            _run("1x1x1x1", 1000.0),
            _run("2x1x1x1", 1800.0),
            _run("2x2x2x1", 2200.0),
            {"config": "4x4x4x4", "error": "StackError: no"},
        ],
    }
    page = render(results)
    rows = {line.split(" | ")[1]: line.split(" | ") for line in page.splitlines() if line.startswith("| tansu")}
    assert rows["1x1x1x1"][3:5] == ["1.00", "-"]
    assert rows["2x1x1x1"][3:5] == ["1.80", "0.80"]  # one worker added: 0.8 of one worker's rate
    assert rows["2x2x2x1"][3:5] == ["2.20", "0.60"]  # a worker and a batcher added
    assert "tansu 4x4x4x4: StackError: no" in page


def test_each_broker_is_set_against_its_own_first_configuration_and_kafka_against_tansu() -> None:
    runs = [
        {**_run("1x1x1x1", 1000.0), "broker": "tansu", "open_broker_us": 200.0},
        {**_run("1x1x1x1", 1500.0), "broker": "kafka", "open_broker_us": 50.0, "open_p99_ms": 45.0},
        {**_run("2x1x1x1", 1800.0), "broker": "tansu"},
        {**_run("2x1x1x1", 2400.0), "broker": "kafka"},
    ]
    for run in runs:
        run["closed_p99_ms"] = 100.0
        run["cpu_us_per_task"] = {**run["cpu_us_per_task"], "broker": 40.0 if run["broker"] == "tansu" else 10.0}
    page = render({"command": "c", "machine": "m", "seconds": 10.0, "runs": runs})
    rows = {tuple(line.split(" | ")[:2]): line.split(" | ") for line in page.splitlines() if line.startswith("| ")}
    assert rows[("| kafka", "2x1x1x1")][3] == "1.60"  # against Kafka's own first, not Tansu's
    assert rows[("| tansu", "2x1x1x1")][3] == "1.80"
    comparison = page.split("Apache Kafka against Tansu")[1]
    # rows/s, closed p99, open p99, worst second (no timeline), broker us, open broker us, all processes
    assert "| 1x1x1x1 | 1.50 | 1.00 | 0.50 | - | 0.25 | 0.25 | 0.95 |" in comparison
    assert "| 2x1x1x1 | 1.33 |" in comparison
    assert "Apache Kafka against Tansu" not in render(
        {"command": "c", "machine": "m", "seconds": 10.0, "runs": runs[::2]}
    )


def test_the_report_names_the_open_loops_rate() -> None:
    results = {"command": "c", "machine": "m", "seconds": 10.0, "runs": [_run("1x1x1x1", 1000.0)]}
    assert "Poisson at 80% of the closed loop's rate" in render(results)
    page = render({**results, "open_rate": 10000.0, "clients": 3072, "load_processes": 6})
    assert "Poisson at 10000 rows/s" in page
    assert "closed loop of 3072 clients for 10 s (load-generating processes: 6)" in page
    assert (
        "| 1x1x1x1 | 1000 | 1.00 | - | 0.0 | 800 | 790 | 50.0 | 90.0 | - | - | - | - | - |" in page
    )  # saved before them
    measured = {**_run("1x1x1x1", 1000.0), "open_broker_us": 120.4, "open_group_mean": 7.3}
    assert "| 90.0 | - | - | 120 | 7.3 | - | 400 | 150 |" in render({**results, "runs": [measured]})
    # The open loop's all-in CPU a task over the closed loop's (550 us: API 400, batcher 150).
    by_role = {"api": 500.0, "batcher": 160.0, "broker": 120.4, "redis": 44.6}
    assert "| 7.3 | 1.50x | 400 | 150 |" in render({**results, "runs": [{**measured, "open_cpu_us_per_task": by_role}]})
    assert "rotated" not in page
    assert "The requests topic rotated every 10 s." in render({**results, "rotation_s": 10.0})


def test_the_open_loops_worst_seconds_are_named() -> None:
    timeline = [
        {"t": 100, "n": 10000, "p99_ms": 180.0, "max_ms": 240.0},
        {"t": 101, "n": 10000, "p99_ms": 1450.0, "max_ms": 1900.0},
        {"t": 102, "n": 10000, "p99_ms": 620.0, "max_ms": 700.0},
        {"t": 103, "n": 10000, "p99_ms": 500.0, "max_ms": 510.0},
    ]
    assert worst_second(timeline)["t"] == 101
    assert worst_second([]) == {}
    run = {**_run("1x1x1x1", 1000.0), "open_by_second": timeline}
    page = render({"command": "c", "machine": "m", "seconds": 10.0, "runs": [run]})
    assert "| 90.0 | 1450 | 2 of 4 |" in page  # 500.0 itself is not over 500 ms
