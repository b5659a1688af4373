"""How a benchmark names where it wrote its report: relative to the project, never a
machine's path."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.saved_report import RESULTS_DIR, command_line, out_dir_flag, why


def test_the_default_results_folder_needs_no_flag() -> None:
    assert out_dir_flag(RESULTS_DIR) == ""


def test_another_folder_is_named_relative_to_the_project() -> None:
    flag = out_dir_flag(RESULTS_DIR / "cost_mode")
    assert flag == " --out-dir bench/results/cost_mode"
    assert str(Path.cwd()) not in flag and str(RESULTS_DIR) not in flag


def test_a_command_names_only_the_flags_that_differ_from_their_defaults() -> None:
    defaults = {"tasks": 2000, "rate": 700.0, "targets": "105,3000"}
    same = argparse.Namespace(tasks=2000, rate=700.0, targets="105,3000", out_dir=RESULTS_DIR)
    assert command_line("bench/cost_burst.py", same, defaults) == "python bench/cost_burst.py"
    other = argparse.Namespace(tasks=500, rate=350.0, targets="105,3000", out_dir=RESULTS_DIR / "x")
    assert (
        command_line("bench/cost_burst.py", other, defaults)
        == "python bench/cost_burst.py --tasks 500 --rate 350 --out-dir bench/results/x"
    )


def test_an_error_is_shown_without_the_scratch_log_it_names_and_within_its_limit() -> None:
    error = RuntimeError("triton: not ready after 60 s (see /scratch/brimful-x/logs/triton.log)")
    assert why(error) == "RuntimeError: triton: not ready after 60 s"
    assert why(ValueError("x" * 400)) == ("ValueError: " + "x" * 400)[:300]
    assert len(why(ValueError("x" * 400), 20)) == 20
