"""How a benchmark names where it wrote its report (relative to the project, never a
machine's path), and how it keeps each step, failed or not, as it goes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.harness.saved_report import RESULTS_DIR, SavedReport, command_line, out_dir_flag, why


def test_the_default_results_folder_needs_no_flag() -> None:
    assert out_dir_flag(RESULTS_DIR) == ""


def test_another_folder_is_named_relative_to_the_project() -> None:
    flag = out_dir_flag(RESULTS_DIR / "cost_mode")
    assert flag == " --out-dir bench/results/cost_mode"
    assert str(Path.cwd()) not in flag and str(RESULTS_DIR) not in flag


def test_a_command_names_only_the_flags_that_differ_from_their_defaults() -> None:
    defaults = {"tasks": 2000, "rate": 700.0, "targets": "105,3000"}
    same = argparse.Namespace(tasks=2000, rate=700.0, targets="105,3000", out_dir=RESULTS_DIR)
    assert command_line("bench.studies.cost_burst", same, defaults) == "python -m bench.studies.cost_burst"
    other = argparse.Namespace(tasks=500, rate=350.0, targets="105,3000", out_dir=RESULTS_DIR / "x")
    assert (
        command_line("bench.studies.cost_burst", other, defaults)
        == "python -m bench.studies.cost_burst --tasks 500 --rate 350 --out-dir bench/results/x"
    )


def test_an_error_is_shown_without_the_scratch_log_it_names_and_within_its_limit() -> None:
    error = RuntimeError("triton: not ready after 60 s (see /scratch/brimful-x/logs/triton.log)")
    assert why(error) == "RuntimeError: triton: not ready after 60 s"
    assert why(ValueError("x" * 400)) == ("ValueError: " + "x" * 400)[:300]
    assert len(why(ValueError("x" * 400), 20)) == 20


def test_each_step_is_saved_as_it_ends_and_a_failed_one_is_kept_with_why(tmp_path: Path) -> None:
    report = SavedReport(tmp_path, "steps", lambda results: f"{len(results['runs'])} runs\n")
    results: dict[str, Any] = {"runs": []}

    def measure(rate: float) -> dict[str, float]:
        if rate > 100:
            raise RuntimeError("overloaded (see /tmp/scratch/logs)")
        return {"p50_ms": rate / 10, "rep": -1}

    first = report.step(results, measure, 50.0, rate=50.0, rep=0)
    assert first == {"p50_ms": 5.0, "rep": 0, "rate": 50.0}  # the label names the step over the figures
    assert json.loads(report.json_path.read_text())["runs"] == [first]
    failed = report.step(results, measure, 500.0, rate=500.0, rep=0)
    assert failed == {"error": "RuntimeError: overloaded", "rate": 500.0, "rep": 0}
    report.step(results, measure, 60.0, rate=60.0, rep=1)  # the next step still runs
    assert [run["rate"] for run in json.loads(report.json_path.read_text())["runs"]] == [50.0, 500.0, 60.0]
    assert report.md_path.read_text() == "3 runs\n"
