"""Why an open loop costs the embedded broker more than a closed one at the same rate.

    .venv/bin/python bench/produce_groups.py [--config 2x1x2x1] [--seconds 8] [--reps 2] [--gaps 0,2]

On a stack of ``bench/scale.py``'s shape (GPU-like model), alternately, each on an emptied
broker: a closed loop of 256 clients, then Poisson open loops at 80% and 40% of the rate it
sustained. For each: rows/s, p50/p99, the broker's and the API's CPU per completed task,
and the mean size of the API's group commits (``brimful_submit_group_size``: the
submissions one Redis round trip and one send carry). In a closed loop answers come back a
batch at a time and the next requests arrive together; spread arrivals leave few a group,
so the broker stores and lists more, smaller record batches for the same tasks (its fetch
lists every batch a partition stores: bench/results/performance-log.md). ``--gaps``: the stack's
``submit_group_gap_ms`` values, each repetition taking every one in turn on a stack of its
own. Figures go to ``produce_groups.json`` as they are measured; ``--render`` rebuilds the
report.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.saved_report import SavedReport, add_report_arguments, command_line, errors_footer, machine_description, why
from bench.scale import Shape, cpu_s, group_sums, start
from bench.throughput import loadgen, stats
from brimful.stack import EmbeddedStack

LOOPS = (("closed", 0.0), ("open 80%", 0.8), ("open 40%", 0.4))


def one_loop(stack: EmbeddedStack, seconds: float, rate: float = 0.0, clients: int = 0) -> dict[str, Any]:
    """A loop with the broker's CPU a completed task and the mean group commit beside it."""
    broker = cpu_s(stack, "broker")
    api = cpu_s(stack, "api")
    submitted, groups = group_sums(stack)
    done = stats(stack).get("tasks_done", 0)
    summary = loadgen(stack, "brimful", seconds, rate=rate, clients=clients)
    tasks = max(1, stats(stack).get("tasks_done", 0) - done)
    submitted_after, groups_after = group_sums(stack)
    return {
        "rows_per_s": summary["achieved_rows_per_s"],
        "p50_ms": summary["p50_ms"],
        "p99_ms": summary["p99_ms"],
        "broker_us_per_task": (cpu_s(stack, "broker") - broker) / tasks * 1e6,
        "api_us_per_task": (cpu_s(stack, "api") - api) / tasks * 1e6,
        "group_mean": (submitted_after - submitted) / max(1.0, groups_after - groups),
        "errors": summary["errors"] + summary["lost"],
    }


def measure(shape: Shape, seconds: float, gap_ms: float) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="brimful-groups-") as scratch:
        stack = start(shape, Path(scratch), submit_group_gap_ms=gap_ms)
        try:
            loops: list[dict[str, Any]] = []
            closed_rate = 0.0
            for name, share in LOOPS:
                if share:
                    stack.empty_broker()
                    loop = one_loop(stack, seconds, rate=share * closed_rate)
                else:
                    loop = one_loop(stack, seconds, clients=256)
                    closed_rate = loop["rows_per_s"]
                loops.append({"loop": name, **loop})
            return loops
        finally:
            stack.stop()


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Group commits and the broker: closed loop against open loops",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. Configuration {results['config']} "
        "(WxBxPxE as in scale.md), GPU-like model; each repetition on a stack of its own, every loop on an "
        "emptied broker. Group: the submissions one API group commit (one Redis round trip, one send) carried, on "
        "average. Gap: the API's submit_group_gap_ms (least time between the starts of two groups). The CPU a task "
        "includes what the broker spends serving idle fetches, which weighs more as the rate falls.",
        "",
        "| rep | gap ms | loop | rows/s | p50 ms | p99 ms | broker us a task | API us a task | tasks a group commit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rep in results["runs"]:
        for loop in rep.get("loops", []):
            api_us = f"{loop['api_us_per_task']:.0f}" if "api_us_per_task" in loop else "-"
            lines.append(
                f"| {rep['rep']} | {rep.get('gap_ms', 0.0):g} | {loop['loop']} | {loop['rows_per_s']:.0f} "
                f"| {loop['p50_ms']:.1f} | {loop['p99_ms']:.1f} | {loop['broker_us_per_task']:.0f} | {api_us} "
                f"| {loop['group_mean']:.2f} |"
            )
    lines += errors_footer(
        [{"errors": sum(loop["errors"] for loop in rep.get("loops", [])), **rep} for rep in results["runs"]],
        lambda rep: f"rep {rep['rep']}, gap {rep.get('gap_ms', 0.0):g} ms",
    )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="2x1x2x1", help="WxBxPxE, as bench/scale.py takes it")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--gaps", default="0", help="comma-separated submit_group_gap_ms values, each rep in turn")
    add_report_arguments(parser, "produce_groups")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "produce_groups", render)
    if args.render:
        report.render_again()
        return 0
    shape = Shape.parse(args.config)
    results: dict[str, Any] = {
        "command": command_line(
            "bench/produce_groups.py", args, {"config": "2x1x2x1", "seconds": 8.0, "reps": 2, "gaps": "0"}
        ),
        "machine": machine_description(),
        "config": str(shape),
        "runs": [],
    }
    gaps = [float(gap) for gap in args.gaps.split(",")]
    for rep in range(1, args.reps + 1):
        for gap_ms in gaps:  # alternated, so a noisy minute falls on each alike
            try:
                results["runs"].append({"rep": rep, "gap_ms": gap_ms, "loops": measure(shape, args.seconds, gap_ms)})
            except Exception as error:  # recorded; the next one still runs
                results["runs"].append({"rep": rep, "gap_ms": gap_ms, "error": why(error)})
            report.save(results)
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
