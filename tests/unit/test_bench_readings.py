"""What the benchmarks read off the processes they measure: model calls from Triton's
counters, the CPU of a process tree, and the open loop's cost set against the closed loop's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.harness.dynamic_batcher import CallTimes
from bench.harness.process_usage import process_tree
from bench.sustained import cost_lines


def test_call_times_between_two_readings_give_rows_and_ms_a_call() -> None:
    before, after = CallTimes(calls=10, rows=300, seconds=0.25), CallTimes(calls=30, rows=1_580, seconds=0.79)
    assert after.since(before) == {"calls": 20, "rows_per_call": 64.0, "call_ms": pytest.approx(27.0)}
    assert after.since(after) == {"calls": 0, "rows_per_call": 0.0, "call_ms": 0.0}  # no call, no division


def test_a_process_tree_holds_a_grandchild_in_a_session_of_its_own() -> None:
    # The child starts a grandchild in a new session (as Ray's daemons do), prints its pid, and waits.
    script = (
        "import subprocess, sys, time; "
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
        "print(g.pid, flush=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    with child:  # its pipe closed and the child reaped, whatever the asserts say
        try:
            assert child.stdout is not None
            grandchild = int(child.stdout.readline())
            assert os.getsid(grandchild) != os.getsid(child.pid)
            tree = process_tree(child.pid)
            assert child.pid in tree and grandchild in tree
            assert os.getpid() not in tree
        finally:
            subprocess.run(["pkill", "-KILL", "-P", str(child.pid)], check=False)
            child.kill()


def _minute(rows_per_s: float, api: float, p50: float, p99: float) -> dict[str, object]:
    spent = {"api": api, "batcher": 200.0, "broker": 150.0, "redis": 50.0, "model": 90.0}
    return {"rows_per_s": rows_per_s, "p50_ms": p50, "p99_ms": p99, "us_per_task": spent}


def test_the_open_loops_cost_is_weighed_by_tasks_against_the_closed_loops() -> None:
    closed = {"api": 300.0, "batcher": 150.0, "broker": 50.0, "redis": 50.0, "model": 90.0}  # all-in 550
    # Minutes of 1,000 and 3,000 tasks a second, all-in 700 and 500 us: 550 us a task weighed by tasks.
    minutes = [_minute(1000.0, 300.0, 80.0, 160.0), _minute(3000.0, 100.0, 100.0, 400.0)]
    (line,) = [text for text in cost_lines({"closed_us_per_task": closed, "minutes": minutes}) if text]
    assert "closed loop 550 us (300 / 150 / 50 / 50)" in line
    assert "open loop 550 us over its minutes: **1.00x**" in line
    assert "p99 / p50 by minute: 2.0, 4.0" in line
    assert cost_lines({"minutes": minutes}) == []  # a run saved before the closed loop's cost was read
