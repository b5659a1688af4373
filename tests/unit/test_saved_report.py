"""How a benchmark names where it wrote its report: relative to the project, never a
machine's path."""

from __future__ import annotations

from pathlib import Path

from bench.saved_report import RESULTS_DIR, out_dir_flag


def test_the_default_results_folder_needs_no_flag() -> None:
    assert out_dir_flag(RESULTS_DIR) == ""


def test_another_folder_is_named_relative_to_the_project() -> None:
    flag = out_dir_flag(RESULTS_DIR / "cost_mode")
    assert flag == " --out-dir bench/results/cost_mode"
    assert str(Path.cwd()) not in flag and str(RESULTS_DIR) not in flag
