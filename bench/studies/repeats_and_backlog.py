"""What identical tasks and a bulk backlog cost: model rows saved by computing repeats
once, and normal latency beside a 10,000-task low-priority backlog.

    .venv/bin/python -m bench.studies.repeats_and_backlog [--rate 75] [--repeat-share 0.3] [--backlog 10000] [--seconds 20] [--reps 2]

Starts the embedded stack with the GPU-like model (every call at least 20 ms; one
instance and a queueing slot, as ``make bench`` runs it). Two comparisons, each side by
side in one run, the order alternated between repetitions:

- **Repeats.** Open-loop Poisson load at ``--rate``: every text distinct, against a
  share ``--repeat-share`` repeating an earlier text of the run. Model rows per request,
  from the shared counters; the load generator checks every answer's digest against its
  own text, so a wrong shared result fails the run.
- **Backlog.** The same normal load with nothing else, against the same load right after
  ``--backlog`` low-priority tasks were submitted (bulk calls of 1,000). Normal p50 and
  p99 from the load generator; padded slots per call while the backlog lasts; how long
  the backlog took to drain. The default rate is about 5% of what Brimful sustains with
  this model in ``make bench`` on a 2-core machine.

Each run's figures go to ``repeats_and_backlog.json`` as soon as they are measured and
the report ``repeats_and_backlog.md`` is rebuilt after each; ``--render`` rebuilds it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

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
from bench.throughput import loadgen, settle, stats
from brimful.stack import EmbeddedStack

DEFAULTS = {"rate": 75.0, "repeat_share": 0.3, "backlog": 10_000, "seconds": 20.0, "reps": 2}
BULK = 1000  # tasks a bulk call carries (the API's max_bulk_tasks)


def _delta(before: dict[str, int], after: dict[str, int], name: str) -> int:
    return after.get(name, 0) - before.get(name, 0)


def run_repeats(stack: EmbeddedStack, rate: float, share: float, seconds: float) -> dict[str, Any]:
    # An empty broker, as make bench runs: the embedded broker's fetches slow as it fills.
    stack.empty_broker()
    before = stats(stack)
    summary = loadgen(stack, "brimful", seconds, rate=rate, extra=("--repeat-share", str(share)))
    settle(stack)
    after = stats(stack)
    requests = summary["finished"]
    return {
        "kind": "repeats",
        "share": share,
        "requests": requests,
        "repeated": summary["repeated"],
        "model_rows_per_request": _delta(before, after, "rows_dispatched") / max(1, requests),
        "cache_hits": _delta(before, after, "cache_hits"),
        "p50_ms": summary["p50_ms"],
        "p99_ms": summary["p99_ms"],
        "errors": summary["errors"] + summary["lost"],
    }


def submit_backlog(stack: EmbeddedStack, count: int) -> None:
    tag = uuid.uuid4().hex
    for start in range(0, count, BULK):
        tasks = [
            {"inputs": {"TEXT": f"bulk {tag} {i}"}, "priority": "low"} for i in range(start, min(count, start + BULK))
        ]
        request = urllib.request.Request(
            f"{stack.api_url}/v1/tasks:batch",
            data=json.dumps({"tasks": tasks}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            accepted = json.load(answer)["accepted"]
        if accepted != len(tasks):
            raise RuntimeError(f"bulk call accepted {accepted} of {len(tasks)}")


def low_pending(stack: EmbeddedStack) -> int:
    """Low-priority rows the batchers hold now, from their status."""
    with urllib.request.urlopen(f"{stack.api_url}/v1/stats", timeout=10) as answer:
        batchers = json.load(answer)["batchers"]
    return sum(p.get("low_pending", 0) for b in batchers for p in b["partitions"].values())


def run_backlog(stack: EmbeddedStack, rate: float, backlog: int, seconds: float) -> dict[str, Any]:
    stack.empty_broker()
    before = stats(stack)
    started = time.monotonic()
    if backlog:
        submit_backlog(stack, backlog)
    submitted_s = time.monotonic() - started
    # No settling first: the run is meant to meet the backlog. While it runs, the counters
    # are read the moment the batcher holds no low row: padding while the backlog lasted.
    outcome: dict[str, Any] = {}
    load = threading.Thread(
        target=lambda: outcome.update(summary=loadgen(stack, "brimful", seconds, rate=rate, settle_first=False))
    )
    load.start()
    at_drain: dict[str, int] | None = None
    drained_s = None
    while load.is_alive():
        if backlog and at_drain is None and low_pending(stack) == 0:
            at_drain, drained_s = stats(stack), time.monotonic() - started
        time.sleep(0.1)
    load.join()
    if "summary" not in outcome:
        raise RuntimeError("the load generator failed (see the output above)")
    summary = outcome["summary"]
    during = stats(stack)
    window = at_drain if backlog and at_drain is not None else during
    batches = _delta(before, window, "batches_dispatched")
    return {
        "kind": "backlog",
        "backlog": backlog,
        "p50_ms": summary["p50_ms"],
        "p99_ms": summary["p99_ms"],
        # Over the calls made while the backlog lasted (without one: over the run).
        "padded_per_call": _delta(before, window, "padded_slots") / max(1, batches),
        "rows_per_call": _delta(before, window, "rows_dispatched") / max(1, batches),
        "backfill_calls": _delta(before, during, "flushes_backfill"),
        "submit_s": round(submitted_s, 2),
        "drained": not backlog or at_drain is not None,
        "drain_s": round(drained_s, 1) if drained_s is not None else None,
        "errors": summary["errors"] + summary["lost"],
    }


def render(results: dict[str, Any]) -> str:
    runs = [run for run in results["runs"] if "error" not in run]
    lines = [
        "# Identical tasks computed once, and normal latency beside a bulk backlog (GPU-like model, one endpoint)",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. Each cell is the range over the "
        "repetitions; latency in ms from the scheduled arrival to the answer.",
        "",
        "## Repeats",
        "",
        "| asked share | repeated (of requests) | model rows per request | cache hits (of requests) | p50 ms | p99 ms | runs |",
        "|---|---|---|---|---|---|---|",
    ]
    repeats = [run for run in runs if run["kind"] == "repeats"]
    for share in sorted({run["share"] for run in repeats}):
        same = [run for run in repeats if run["share"] == share]
        lines.append(
            f"| {share:g} | {value_range([r['repeated'] / r['requests'] for r in same], 3)} | "
            f"{value_range([r['model_rows_per_request'] for r in same], 3)} | "
            f"{value_range([r['cache_hits'] / r['requests'] for r in same], 3)} | {value_range([r['p50_ms'] for r in same], 1)} | "
            f"{value_range([r['p99_ms'] for r in same], 1)} | {len(same)} |"
        )
    by_rep = {(r["rep"], r["share"]): r for r in repeats}
    ratios = [
        by_rep[(rep, s)]["model_rows_per_request"] / by_rep[(rep, 0.0)]["model_rows_per_request"]
        for rep, s in by_rep
        if s and (rep, 0.0) in by_rep
    ]
    if ratios:
        lines += [
            "",
            f"Model rows with repeats against without, same repetition: {value_range(ratios, 3)}x "
            "(every answer's digest checked against its own text).",
        ]
    lines += [
        "",
        "## Normal load beside a low-priority backlog",
        "",
        "| backlog | normal p50 ms | normal p99 ms | rows per call* | padded slots per call* | backfill calls | drained in s | runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    backlog_runs = [run for run in runs if run["kind"] == "backlog"]
    for backlog in sorted({run["backlog"] for run in backlog_runs}):
        same = [run for run in backlog_runs if run["backlog"] == backlog]
        drained = [r["drain_s"] for r in same if r["drain_s"] is not None]
        lines.append(
            f"| {backlog} | {value_range([r['p50_ms'] for r in same], 1)} | {value_range([r['p99_ms'] for r in same], 1)} | "
            f"{value_range([r['rows_per_call'] for r in same], 1)} | {value_range([r['padded_per_call'] for r in same], 1)} | "
            f"{value_range([r['backfill_calls'] for r in same], 0)} | "
            f"{value_range(drained, 1) if drained else ('-' if not backlog else 'not drained')} | {len(same)} |"
        )
    lines.append(
        "\n\\* With a backlog: over the calls made until the batcher held no low-priority row (the "
        "backlog lasted); without: over the run."
    )
    pairs = {(r["rep"], r["backlog"] > 0): r for r in backlog_runs}
    for name in ("p50_ms", "p99_ms"):
        ratios = [
            pairs[(rep, True)][name] / pairs[(rep, False)][name]
            for rep, loaded in pairs
            if loaded and (rep, False) in pairs
        ]
        if ratios:
            lines.append(
                f"\nNormal {name[:3]} with the backlog against without, same repetition: {value_range(ratios, 2)}x."
            )
    lines += errors_footer(results["runs"], lambda run: run["kind"])
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=DEFAULTS["rate"], help="normal load, tasks/s")
    parser.add_argument("--repeat-share", type=float, default=DEFAULTS["repeat_share"])
    parser.add_argument("--backlog", type=int, default=DEFAULTS["backlog"], help="low-priority tasks submitted")
    parser.add_argument("--seconds", type=float, default=DEFAULTS["seconds"], help="length of each load run")
    parser.add_argument("--reps", type=int, default=DEFAULTS["reps"])
    add_report_arguments(parser, "repeats_and_backlog")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "repeats_and_backlog", render)
    if args.render:
        report.render_again()
        return 0
    command = "python -m bench.studies.repeats_and_backlog"
    for flag, value, default in (
        ("--rate", args.rate, DEFAULTS["rate"]),
        ("--repeat-share", args.repeat_share, DEFAULTS["repeat_share"]),
        ("--backlog", args.backlog, DEFAULTS["backlog"]),
        ("--seconds", args.seconds, DEFAULTS["seconds"]),
        ("--reps", args.reps, DEFAULTS["reps"]),
    ):
        command += "" if value == default else f" {flag} {value:g}"
    command += out_dir_flag(args.out_dir)
    results: dict[str, Any] = {"command": command, "machine": machine_description(), "runs": []}
    model = MODELS["gpu-like"]
    settings = load_settings(model)

    with tempfile.TemporaryDirectory(prefix="brimful-repeats-") as scratch:
        stack = EmbeddedStack(settings, Path(scratch), model_host_args=model.host_args)
        stack.start()
        try:
            for rep in range(args.reps):
                shares = [0.0, args.repeat_share]
                backlogs = [0, args.backlog]
                if rep % 2:
                    shares.reverse()
                    backlogs.reverse()
                steps: list[tuple[str, float]] = [("repeats", s) for s in shares] + [("backlog", b) for b in backlogs]
                for kind, value in steps:
                    if kind == "repeats":
                        report.step(
                            results, run_repeats, stack, args.rate, value, args.seconds, kind=kind, value=value, rep=rep
                        )
                    else:
                        report.step(
                            results,
                            run_backlog,
                            stack,
                            args.rate,
                            int(value, args.seconds),
                            kind=kind,
                            value=value,
                            rep=rep,
                        )
        finally:
            stack.stop()
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
