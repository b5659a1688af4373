"""Where a benchmark keeps what it measured: ``<stem>.json``, rewritten after every step,
and the Markdown report ``<stem>.md`` rebuilt from it each time. A run that fails half-way
keeps what it measured before; ``--render`` rebuilds the report from the JSON alone."""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def machine_description() -> str:
    """The machine a run measured, for the report's header."""
    return f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPU cores, Python {platform.python_version()}"


def value_range(values: list[float], digits: int) -> str:
    """A report cell: the range of a figure over repetitions ("low-high"), or one value
    when they agree to ``digits``."""
    low, high = min(values), max(values)
    return f"{low:.{digits}f}" if round(low, digits) == round(high, digits) else f"{low:.{digits}f}-{high:.{digits}f}"


def why(error: Exception, limit: int = 300) -> str:
    """An error as a report shows it: its class and message, cut to ``limit``, without the
    "(see <log path>)" of a stack error, whose scratch folder is gone once the run ends."""
    return re.sub(r" \(see [^)]*\)", "", f"{type(error).__name__}: {error}")[:limit]


def errors_footer(runs: list[dict[str, Any]], describe: Callable[[dict[str, Any]], str]) -> list[str]:
    """The report's last lines: errors and lost requests over the runs that finished,
    then each run that failed (``describe`` names it) with its error."""
    failed = [run for run in runs if "error" in run]
    errors = sum(run.get("errors", 0) for run in runs if "error" not in run)
    return ["", f"Errors or lost requests: {errors}. Runs that failed: {len(failed)}."] + [
        f"- {describe(run)}: {run['error']}" for run in failed
    ]


def add_report_arguments(parser: argparse.ArgumentParser, stem: str) -> None:
    """``--out-dir`` and ``--render`` as every benchmark script takes them."""
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--render", action="store_true", help=f"rebuild {stem}.md from {stem}.json")


def out_dir_flag(out_dir: Path) -> str:
    """`` --out-dir DIR`` for a report's command line when a run wrote somewhere other than
    bench/results, relative to the project so no machine's path lands in a report."""
    if out_dir.resolve() == RESULTS_DIR:
        return ""
    return f" --out-dir {os.path.relpath(out_dir.resolve(), RESULTS_DIR.parent.parent)}"


def command_line(module: str, args: argparse.Namespace, defaults: Mapping[str, object]) -> str:
    """The command a report names: ``python -m <module>``, each flag of ``defaults`` (its
    name as argparse stores it) whose value differs, and ``--out-dir`` where not the default."""
    command = f"python -m {module}"
    for name, default in defaults.items():
        value = getattr(args, name)
        if value != default:
            command += (
                f" --{name.replace('_', '-')} {value:g}"
                if isinstance(value, float)
                else f" --{name.replace('_', '-')} {value}"
            )
    return command + out_dir_flag(args.out_dir)


class SavedReport:
    """The JSON of a run and its report, in ``out_dir``."""

    def __init__(self, out_dir: Path, stem: str, render: Callable[[dict[str, Any]], str]) -> None:
        self.json_path, self.md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
        self._render = render

    def save(self, results: dict[str, Any]) -> None:
        """Write what was measured so far, and the report of it."""
        self.json_path.parent.mkdir(parents=True, exist_ok=True)
        self.json_path.write_text(json.dumps(results, indent=2))
        self.md_path.write_text(self._render(results))

    def step(
        self, results: dict[str, Any], measure: Callable[..., Mapping[str, Any]], /, *args: Any, **label: Any
    ) -> dict[str, Any]:
        """Run one step of a benchmark, ``measure(*args)``, and keep it: what ``label`` names
        it by (its case, repetition, ...) with the step's figures, or with why it failed, so
        a failed step shows in the report and the next one still runs. The run is added to
        ``results["runs"]``, saved, printed on one line, and returned."""
        try:
            figures = dict(measure(*args))
        except Exception as error:  # recorded; the next step still runs
            figures = {"error": why(error)}
        run = {**figures, **label}
        results["runs"].append(run)
        self.save(results)
        print("  " + ", ".join(f"{key} {value}" for key, value in run.items()), flush=True)
        return run

    def render_again(self) -> None:
        """Rebuild the report from the saved JSON."""
        self.md_path.write_text(self._render(json.loads(self.json_path.read_text())))
