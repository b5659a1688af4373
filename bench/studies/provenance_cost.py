"""What a task's provenance costs: the API's and the batcher's CPU a task, with it written
and shown and without, side by side in one run.

    .venv/bin/python -m bench.studies.provenance_cost [--model reference] [--seconds 15] [--reps 3]

Each repetition starts the embedded stack twice, once with ``BRIMFUL_TASK_PROVENANCE`` off
and once on (the order alternates between repetitions), and drives it with the closed loop
``make bench`` uses at saturation (256 clients, each task long-polled: its answer read from
the finished-task message, as most answers are). The CPU time of every API worker and of
the batcher is read from /proc before and after, and divided by the tasks done. The
reference model (hashing, cheap) is the default: Brimful's own work is most of the CPU
there, so a cost shows most.

The end-to-end figures move by a fifth from run to run on a shared machine, more than the
cost sought; so the study also times, in this process, the code the provenance adds to a
task's path, against the same path without it, side by side (``in_process``): the
batcher's (a call's stored provenance made, each task's joined on) and the API's (a
finished-task entry read and answered, with and without its provenance).

Figures go to ``provenance_cost.json`` as soon as they are measured, and the report
``provenance_cost.md`` is rebuilt after each; ``--render`` rebuilds it from the JSON.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench.harness.load_settings import load_settings
from bench.harness.process_usage import usage
from bench.harness.saved_report import (
    SavedReport,
    add_report_arguments,
    command_line,
    errors_footer,
    machine_description,
    value_range,
)
from bench.harness.throughput_plan import CLIENTS, MODELS
from bench.throughput import loadgen, process_pids, stats
from brimful.core.task_provenance import CallFacts, StoredProvenance
from brimful.core.task_record import FinishedMessage, task_record_answer
from brimful.stack import EmbeddedStack

DEFAULTS = {"model": "reference", "seconds": 15.0, "reps": 3}
WARM_S = 4.0
PROCESSES = {"api": "api", "batcher": "batcher-0"}  # as the report names them: the stack's names


def measure(model: str, provenance: bool, seconds: float) -> dict[str, Any]:
    """One stack with provenance on or off: its API's and batcher's CPU a task done."""
    bench_model = MODELS[model]
    settings = load_settings(bench_model, task_provenance=provenance)
    with tempfile.TemporaryDirectory(prefix="brimful-provenance-") as scratch:
        stack = EmbeddedStack(settings, Path(scratch), model_host_args=bench_model.host_args)
        stack.start()
        try:
            loadgen(stack, "brimful", WARM_S, clients=CLIENTS)
            before = {name: usage(process_pids(stack, part)).cpu_s for name, part in PROCESSES.items()}
            done_before = stats(stack).get("tasks_done", 0)
            summary = loadgen(stack, "brimful", seconds, clients=CLIENTS)
            after = {name: usage(process_pids(stack, part)).cpu_s for name, part in PROCESSES.items()}
            tasks = max(1, stats(stack).get("tasks_done", 0) - done_before)
        finally:
            stack.stop()
    return {
        **{f"{name}_us": (after[name] - before[name]) / tasks * 1e6 for name in PROCESSES},
        "tasks": tasks,
        "rows_per_s": summary["achieved_rows_per_s"],
        "p50_ms": summary["p50_ms"],
        "errors": summary["errors"] + summary["lost"],
    }


def in_process(rounds: int = 5, tasks: int = 64_000) -> dict[str, Any]:
    """Microseconds a task of the code provenance adds, and of the API's answer path with
    and without it; each the best of ``rounds``."""
    facts = CallFacts(
        "b" * 32, 1, "deadline", 37, 27, 1, "http://10.0.0.1:8001", 10**18, 10**18 + 10**6, 10**18 + 2 * 10**7
    )
    outputs = orjson.dumps({"SHA256": "a" * 64, "LENGTH": 17})
    stored = StoredProvenance(facts).of(10**18 - 10**6)
    plain = b"\n".join([b"t" * 32, b"done", b"1000", b"1030", b"tenant", b"model", b"", b"outputs", outputs])
    carried = b"\n".join([b"t" * 32, b"done", b"1000", b"1030", b"tenant", b"model", stored, b"outputs", outputs])

    def batcher() -> None:
        for _ in range(tasks // 64):
            made = StoredProvenance(facts)
            for n in range(64):
                made.of(n)

    def answer(entry: bytes) -> Callable[[], None]:
        def run() -> None:
            for _ in range(tasks):
                record = FinishedMessage.record(entry)
                orjson.dumps(task_record_answer("t", record, "model"))

        return run

    def best(work: Callable[[], None]) -> float:
        return min(timeit.timeit(work, number=1) for _ in range(rounds)) / tasks * 1e6

    return {
        "batcher_added_us": best(batcher),
        "api_answer_without_us": best(answer(plain)),
        "api_answer_with_us": best(answer(carried)),
    }


def render(results: dict[str, Any]) -> str:
    lines = [
        f"# What a task's provenance costs ({results['model']} model)",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. Closed loop of {CLIENTS} clients for "
        f"{results['seconds']:g} s on a fresh stack each, provenance off and on alternating; CPU microseconds a "
        "task done, summed over the process's workers; each cell is the range over the runs (median in brackets).",
        "",
        "| provenance | API us a task | batcher us a task | API + batcher | rows/s | p50 ms | runs |",
        "|---|---|---|---|---|---|---|",
    ]
    runs = [run for run in results["runs"] if "error" not in run]
    medians: dict[str, float] = {}
    for case in ("off", "on"):
        same = [run for run in runs if run["case"] == case]
        if not same:
            continue
        both = [run["api_us"] + run["batcher_us"] for run in same]
        medians[case] = statistics.median(both)
        lines.append(
            f"| {case} | {_cell([r['api_us'] for r in same])} | {_cell([r['batcher_us'] for r in same])} "
            f"| {_cell(both)} | {value_range([r['rows_per_s'] for r in same], 0)} "
            f"| {value_range([r['p50_ms'] for r in same], 1)} | {len(same)} |"
        )
    if len(medians) == 2:
        lines += ["", f"On against off, API + batcher, medians: {medians['on'] / medians['off']:.3f}x."]
    timed = results.get("in_process")
    if timed:
        without, with_ = timed["api_answer_without_us"], timed["api_answer_with_us"]
        lines += [
            "",
            "In process, best of 5 rounds of 64,000 tasks: the batcher's added work "
            f"{timed['batcher_added_us']:.2f} us a task; the API's entry read and answer {without:.2f} us "
            f"without provenance, {with_:.2f} us with ({with_ - without:+.2f} us, {with_ / without:.2f}x).",
        ]
    lines += errors_footer(results["runs"], lambda run: f"provenance {run['case']}, repetition {run['rep']}")
    return "\n".join(lines) + "\n"


def _cell(values: list[float]) -> str:
    return f"{value_range(values, 0)} ({statistics.median(values):.0f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default=DEFAULTS["model"])
    parser.add_argument("--seconds", type=float, default=DEFAULTS["seconds"], help="length of each measured run")
    parser.add_argument("--reps", type=int, default=DEFAULTS["reps"], help="repetitions of off and on")
    add_report_arguments(parser, "provenance_cost")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "provenance_cost", render)
    if args.render:
        report.render_again()
        return 0
    results: dict[str, Any] = {
        "command": command_line("bench.studies.provenance_cost", args, DEFAULTS),
        "machine": machine_description(),
        "model": args.model,
        "seconds": args.seconds,
        "runs": [],
    }
    results["in_process"] = in_process()
    report.save(results)
    for rep in range(args.reps):
        for case in ("off", "on") if rep % 2 == 0 else ("on", "off"):
            report.step(results, measure, args.model, case == "on", args.seconds, case=case, rep=rep)
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
