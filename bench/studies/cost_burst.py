"""Does the cost mode fill? A burst of tasks at the default latency target and at a high
one (the cost mode: fill first), side by side on one stack.

    .venv/bin/python -m bench.studies.cost_burst [--tasks 2000] [--rate 700] [--targets 105,3000] [--reps 3]

Starts the embedded stack with the GPU-like model (one instance and a second slot, as
``make bench`` runs it). Each repetition sends, for each ``latency_target_ms`` in turn
(tuned live, as an operator would; the order alternates between repetitions), a burst of
about ``--tasks`` tasks as open-loop Poisson arrivals at ``--rate`` a second onto an empty
broker, waits for every answer, and counts the model calls the burst took from the shared
counters: rows per call, and calls beyond the fewest that could carry its rows.

Each run's figures go to ``cost_burst.json`` as soon as they are measured and the report
``cost_burst.md`` is rebuilt after each; ``--render`` rebuilds it from the JSON.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.harness.load_settings import load_settings
from bench.harness.saved_report import (
    SavedReport,
    add_report_arguments,
    command_line,
    errors_footer,
    machine_description,
    value_range,
)
from bench.harness.throughput_plan import MODELS
from bench.throughput import loadgen, stats, tune
from brimful.stack import EmbeddedStack

DEFAULTS = {"tasks": 2000, "rate": 700.0, "targets": "105,3000", "reps": 3}


def run_burst(stack: EmbeddedStack, tasks: int, rate: float, target_ms: float) -> dict[str, Any]:
    """One burst at ``latency_target_ms`` = ``target_ms``: its latency and the calls it took."""
    tune(stack, latency_target_ms=target_ms)
    stack.empty_broker()
    before = stats(stack)
    # No warm-up: the burst's first rows are what a cold rate estimate sends short.
    summary = loadgen(stack, "brimful", tasks / rate, rate=rate, extra=("--warmup", "0"))
    after = stats(stack)
    calls = after.get("batches_dispatched", 0) - before.get("batches_dispatched", 0)
    rows = after.get("rows_dispatched", 0) - before.get("rows_dispatched", 0)
    return {
        "target_ms": target_ms,
        "requests": summary["requests"],
        "rows": rows,
        "calls": calls,
        "fewest_calls": math.ceil(rows / 64),
        "rows_per_call": rows / calls if calls else 0.0,
        "p50_ms": summary["p50_ms"],
        "p99_ms": summary["p99_ms"],
        "errors": summary["errors"] + summary["lost"],
    }


def render(results: dict[str, Any]) -> str:
    lines = [
        "# A burst at the default latency target and in the cost mode (GPU-like model, one endpoint)",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. A burst of about "
        f"{results['tasks']} tasks at {results['rate']:g}/s (open-loop Poisson, no warm-up) on an empty broker "
        "for each target in turn; each cell is the range over the repetitions; ms from the scheduled arrival "
        "to the answer. Extra calls: calls beyond the fewest 64-row calls that carry the burst's rows.",
        "",
        "| latency_target_ms | rows per call | calls | extra calls | p50 ms | p99 ms | runs |",
        "|---|---|---|---|---|---|---|",
    ]
    runs = [run for run in results["runs"] if "error" not in run]
    for target in sorted({run["target_ms"] for run in runs}):
        same = [run for run in runs if run["target_ms"] == target]
        lines.append(
            f"| {target:g} | {value_range([r['rows_per_call'] for r in same], 1)} "
            f"| {value_range([r['calls'] for r in same], 0)} "
            f"| {value_range([r['calls'] - r['fewest_calls'] for r in same], 0)} "
            f"| {value_range([r['p50_ms'] for r in same], 1)} | {value_range([r['p99_ms'] for r in same], 1)} "
            f"| {len(same)} |"
        )
    lines += errors_footer(results["runs"], lambda run: f"target {run['target_ms']:g} ms, repetition {run['rep']}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=DEFAULTS["tasks"], help="tasks in a burst (about)")
    parser.add_argument("--rate", type=float, default=DEFAULTS["rate"], help="the burst's arrivals a second")
    parser.add_argument("--targets", default=DEFAULTS["targets"], help="latency_target_ms values to compare")
    parser.add_argument("--reps", type=int, default=DEFAULTS["reps"], help="repetitions")
    add_report_arguments(parser, "cost_burst")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "cost_burst", render)
    if args.render:
        report.render_again()
        return 0
    command = command_line("bench.studies.cost_burst", args, DEFAULTS)
    results: dict[str, Any] = {
        "command": command,
        "machine": machine_description(),
        "tasks": args.tasks,
        "rate": args.rate,
        "runs": [],
    }
    model = MODELS["gpu-like"]
    settings = load_settings(model)
    targets = [float(part) for part in args.targets.split(",")]
    with tempfile.TemporaryDirectory(prefix="brimful-burst-") as scratch:
        stack = EmbeddedStack(settings, Path(scratch), model_host_args=model.host_args)
        stack.start()
        try:
            for rep in range(args.reps):
                for target in targets if rep % 2 == 0 else targets[::-1]:
                    report.step(results, run_burst, stack, args.tasks, args.rate, target, target_ms=target, rep=rep)
            tune(stack, latency_target_ms=settings.latency_target_ms)
        finally:
            stack.stop()
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
