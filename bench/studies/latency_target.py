"""What the latency target buys and costs: rows per call against latency, beside Triton's
dynamic batcher at the same load.

    .venv/bin/python -m bench.studies.latency_target [--rates 90,450,900] [--targets 50:4,105,130] [--reps 2] [--seconds 10]

Starts the embedded stack with the GPU-like model (every call at least 20 ms; one instance,
and a second slot that queues the next call, as ``make bench`` runs it). At each offered
rate (open-loop Poisson) it runs the dynamic batcher once, then Brimful once per
``latency_target_ms`` (``TARGET:ROWS`` also sets ``min_worthwhile_rows``; a bare target keeps
the default), tuned live as an operator would (``PATCH /v1/admin/policy``), each
Brimful run on an empty broker. Repetitions alternate the targets' order, so a machine that
slows during the run weighs on no target more than another. The default rates are about 5%,
25% and 50% of the load Brimful sustains with this model in ``make bench`` on a 2-core machine;
the default targets are the policy's earlier defaults (50 ms with 4 rows), its current ones
(105 with 8) and one step towards fill first.

Each run's figures go to ``latency_target.json`` as soon as they are measured and the
report ``latency_target.md`` is rebuilt after each; ``--render`` rebuilds it from the JSON.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.harness.dynamic_batcher import DynamicBatcherServer
from bench.harness.load_settings import load_settings
from bench.harness.saved_report import (
    SavedReport,
    add_report_arguments,
    errors_footer,
    machine_description,
    out_dir_flag,
    value_range,
)
from bench.harness.throughput_plan import MODELS
from bench.throughput import brimful_open_loop, dynamic_open_loop, tune
from brimful.stack import EmbeddedStack

DEFAULT_RATES = "90,450,900"
DEFAULT_TARGETS = "50:4,105,130"


def run_dynamic(stack: EmbeddedStack, anchor: DynamicBatcherServer, rate: float, seconds: float) -> dict[str, Any]:
    summary, rows_per_call = dynamic_open_loop(stack, anchor, rate, seconds)
    return {"path": "dynamic", **_figures(summary), "rows_per_call": rows_per_call}


def run_brimful(
    stack: EmbeddedStack, rate: float, target_ms: float, worthwhile: float, seconds: float
) -> dict[str, Any]:
    tune(stack, latency_target_ms=target_ms, min_worthwhile_rows=worthwhile)
    summary, rows_per_call = brimful_open_loop(stack, rate, seconds)
    return {
        "path": "brimful",
        "target_ms": target_ms,
        "min_worthwhile_rows": worthwhile,
        **_figures(summary),
        "rows_per_call": rows_per_call,
    }


def parse_targets(text: str, default_worthwhile: float) -> list[tuple[float, float]]:
    """``"50:4,105"`` -> [(50, 4), (105, default_worthwhile)]: each target with its min_worthwhile_rows."""
    pairs = []
    for part in text.split(","):
        target, _, rows = part.partition(":")
        pairs.append((float(target), float(rows) if rows else default_worthwhile))
    return pairs


def _figures(summary: dict[str, Any]) -> dict[str, Any]:
    return {"p50_ms": summary["p50_ms"], "p99_ms": summary["p99_ms"], "errors": summary["errors"] + summary["lost"]}


def _setup(run: dict[str, Any]) -> tuple[str, float, float]:
    """What a run compared: its path, and for Brimful its target and worthwhile rows."""
    return run["path"], run.get("target_ms", 0.0), run.get("min_worthwhile_rows", 0.0)


def render(results: dict[str, Any]) -> str:
    lines = [
        "# The latency target's price: rows per call against latency (GPU-like model, one endpoint)",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. Each cell is the range over the "
        "repetitions; ms from the scheduled arrival to the answer.",
        "",
        "| rate /s | path | latency_target_ms | min_worthwhile_rows | p50 ms | p99 ms | rows per call | runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    runs = [run for run in results["runs"] if "error" not in run]
    for rate in sorted({run["rate"] for run in runs}):
        for path, target, worthwhile in sorted({_setup(run) for run in runs if run["rate"] == rate}):
            same = [run for run in runs if run["rate"] == rate and _setup(run) == (path, target, worthwhile)]
            brimful = path == "brimful"
            lines.append(
                f"| {rate:.0f} | {path} | {f'{target:g}' if brimful else '-'} | {f'{worthwhile:g}' if brimful else '-'} "
                f"| {value_range([r['p50_ms'] for r in same], 1)} | {value_range([r['p99_ms'] for r in same], 1)} "
                f"| {value_range([r['rows_per_call'] for r in same], 1)} | {len(same)} |"
            )
    lines += errors_footer(results["runs"], lambda run: f"{run['rate']:.0f}/s {run['path']} {run.get('target_ms', '')}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default=DEFAULT_RATES, help="offered loads, tasks/s")
    parser.add_argument("--targets", default=DEFAULT_TARGETS, help="latency_target_ms values to compare")
    parser.add_argument("--reps", type=int, default=2, help="repetitions at each rate")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each run")
    add_report_arguments(parser, "latency_target")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "latency_target", render)
    if args.render:
        report.render_again()
        return 0
    command = "python -m bench.studies.latency_target"
    for flag, value, default in (
        ("--rates", args.rates, DEFAULT_RATES),
        ("--targets", args.targets, DEFAULT_TARGETS),
        ("--reps", args.reps, 2),
        ("--seconds", args.seconds, 10.0),
    ):
        command += "" if value == default else f" {flag} {value}"
    command += out_dir_flag(args.out_dir)
    results: dict[str, Any] = {
        "command": command,
        "machine": machine_description(),
        "runs": [],
    }
    model = MODELS["gpu-like"]
    settings = load_settings(model)
    targets = parse_targets(args.targets, settings.min_worthwhile_rows)

    with tempfile.TemporaryDirectory(prefix="brimful-target-") as scratch:
        stack = EmbeddedStack(settings, Path(scratch), model_host_args=model.host_args)
        anchor = DynamicBatcherServer(Path(scratch) / "dynamic", model.served, model.call_ms)
        stack.start()
        try:
            anchor.start()
            for rate in (float(part) for part in args.rates.split(",")):
                for rep in range(args.reps):
                    steps: list[tuple[str, float, float]] = [("dynamic", 0.0, 0.0)]
                    steps += [("brimful", *pair) for pair in (targets if rep % 2 == 0 else targets[::-1])]
                    for path, target, worthwhile in steps:
                        if path == "dynamic":
                            report.step(
                                results, run_dynamic, stack, anchor, rate, args.seconds, path=path, rate=rate, rep=rep
                            )
                        else:
                            report.step(
                                results,
                                run_brimful,
                                stack,
                                rate,
                                target,
                                worthwhile,
                                args.seconds,
                                path=path,
                                target_ms=target,
                                min_worthwhile_rows=worthwhile,
                                rate=rate,
                                rep=rep,
                            )
            tune(stack, latency_target_ms=settings.latency_target_ms, min_worthwhile_rows=settings.min_worthwhile_rows)
        finally:
            anchor.stop()
            stack.stop()
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
