"""Does a batch job slow interactive calls? Interactive latency with and without a large
batch job running, side by side on one stack, and what a large upload costs the API in
memory.

    .venv/bin/python -m bench.studies.batch_interference [--lines 50000] [--rate 600] [--seconds 20] [--reps 2]

The GPU-like model (every call at least 20 ms, 64 rows), as ``make bench`` runs it, with
the requests topics rotating every 10 s as ``bench/sustained.py`` runs them. Each
repetition measures an open loop of interactive tasks at ``--rate`` a second for
``--seconds`` twice, alternating: alone, and while a batch job of ``--lines`` lines over
``/v1/tasks`` runs (its lines are low-priority tasks: they should fill the padding the
interactive calls leave, not delay them). It reports p50 and p99 from the scheduled
arrival, the rows a model call carried, and the batch lines finished during the window.

First it uploads the job's file, and a file of about ``--upload-mb`` MB, and reports each
upload's time and how much the API's resident memory grew (its peak, from /proc): an
upload streams into the file store, so it should not grow with the file.

Figures go to ``batch_interference.json`` as soon as they are measured and the report
``batch_interference.md`` is rebuilt after each; ``--render`` rebuilds it from the JSON.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
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
from bench.harness.throughput_plan import MODELS
from bench.throughput import loadgen, process_pids, stats
from brimful.stack import EmbeddedStack

ROTATION_S = 10.0
DEFAULTS = {"lines": 50_000, "rate": 600.0, "seconds": 20.0, "reps": 2, "upload_mb": 200}


def write_job(path: Path, lines: int) -> None:
    with path.open("wb") as out:
        for n in range(lines):
            line = {
                "custom_id": f"l{n}",
                "method": "POST",
                "url": "/v1/tasks",
                "body": {"inputs": {"TEXT": f"job {n}"}},
            }
            out.write(orjson.dumps(line) + b"\n")


def write_large(path: Path, megabytes: int) -> None:
    """About ``megabytes`` MB of JSONL, lines of 4 KB."""
    padding = "x" * 4000
    with path.open("wb") as out:
        for n in range(megabytes * 1024 * 1024 // 4096):
            body = {"inputs": {"TEXT": f"{n} {padding}"}}
            out.write(orjson.dumps({"custom_id": f"b{n}", "method": "POST", "url": "/v1/tasks", "body": body}) + b"\n")


def upload(stack: EmbeddedStack, path: Path) -> dict[str, Any]:
    """Upload a file; its id, seconds, and the growth of the API's peak resident memory."""
    pids = process_pids(stack, "api")
    before, started = usage(pids).peak_rss_mb, time.perf_counter()
    with path.open("rb") as content:
        answer = httpx.post(
            f"{stack.api_url}/v1/files",
            files={"file": (path.name, content)},
            data={"purpose": "batch"},
            timeout=httpx.Timeout(600.0),
        )
    answer.raise_for_status()
    return {
        "file_id": answer.json()["id"],
        "mb": path.stat().st_size / 1024 / 1024,
        "seconds": time.perf_counter() - started,
        "api_peak_rss_growth_mb": usage(pids).peak_rss_mb - before,
    }


def interactive(stack: EmbeddedStack, rate: float, seconds: float, settle_first: bool) -> dict[str, Any]:
    before = stats(stack)
    summary = loadgen(stack, "brimful", seconds, rate=rate, settle_first=settle_first)
    after = stats(stack)
    calls = after.get("batches_dispatched", 0) - before.get("batches_dispatched", 0)
    rows = after.get("rows_dispatched", 0) - before.get("rows_dispatched", 0)
    return {
        "p50_ms": summary["p50_ms"],
        "p99_ms": summary["p99_ms"],
        "requests": summary["requests"],
        "rows_per_call": rows / calls if calls else 0.0,
        "errors": summary["errors"] + summary["lost"],
    }


def batch_state(stack: EmbeddedStack, batch_id: str) -> dict[str, Any]:
    return dict(httpx.get(f"{stack.api_url}/v1/batches/{batch_id}", timeout=30).json())


def with_job(stack: EmbeddedStack, file_id: str, rate: float, seconds: float) -> dict[str, Any]:
    made = httpx.post(
        f"{stack.api_url}/v1/batches",
        json={"input_file_id": file_id, "endpoint": "/v1/tasks", "completion_window": "24h"},
        timeout=30,
    ).json()
    deadline = time.monotonic() + 120
    while batch_state(stack, made["id"])["status"] != "in_progress":  # counted, now running
        if time.monotonic() > deadline:
            raise TimeoutError("the batch job did not start")
        time.sleep(0.5)
    start = batch_state(stack, made["id"])["request_counts"]
    run = interactive(stack, rate, seconds, settle_first=False)
    end = batch_state(stack, made["id"])
    run["batch_lines_done"] = end["request_counts"]["completed"] - start["completed"]
    run["batch_status"] = end["status"]
    httpx.post(f"{stack.api_url}/v1/batches/{made['id']}/cancel", timeout=30)  # the next run starts idle
    deadline = time.monotonic() + 300
    while batch_state(stack, made["id"])["status"] not in ("cancelled", "completed"):
        if time.monotonic() > deadline:
            raise TimeoutError("the batch job did not end")
        time.sleep(1)
    return run


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Interactive calls beside a large batch job (GPU-like model)",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. Open loop of interactive tasks at "
        f"{results['rate']:g}/s for {results['seconds']:g} s, alone and while a batch job of {results['lines']} lines "
        "over /v1/tasks runs, alternated; ms from the scheduled arrival; each cell is the range over the runs.",
        "",
        "| interactive calls | p50 ms | p99 ms | rows a model call | batch lines done in the window | runs |",
        "|---|---|---|---|---|---|",
    ]
    runs = [run for run in results["runs"] if "error" not in run]
    for case in ("alone", "beside the job"):
        same = [run for run in runs if run["case"] == case]
        if same:
            done = value_range([r.get("batch_lines_done", 0) for r in same], 0) if case != "alone" else "-"
            lines.append(
                f"| {case} | {value_range([r['p50_ms'] for r in same], 1)} | {value_range([r['p99_ms'] for r in same], 1)} "
                f"| {value_range([r['rows_per_call'] for r in same], 1)} | {done} | {len(same)} |"
            )
    if results.get("uploads"):
        lines += ["", "| upload | MB | seconds | API peak memory growth, MB |", "|---|---|---|---|"]
        for name, up in results["uploads"].items():
            lines.append(f"| {name} | {up['mb']:.0f} | {up['seconds']:.1f} | {up['api_peak_rss_growth_mb']:.1f} |")
    lines += errors_footer(results["runs"], lambda run: f"{run['case']}, repetition {run['rep']}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=DEFAULTS["lines"], help="lines of the batch job")
    parser.add_argument("--rate", type=float, default=DEFAULTS["rate"], help="interactive tasks a second")
    parser.add_argument("--seconds", type=float, default=DEFAULTS["seconds"], help="length of each window")
    parser.add_argument("--reps", type=int, default=DEFAULTS["reps"], help="repetitions")
    parser.add_argument("--upload-mb", type=int, default=DEFAULTS["upload_mb"], help="size of the large upload")
    add_report_arguments(parser, "batch_interference")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "batch_interference", render)
    if args.render:
        report.render_again()
        return 0
    results: dict[str, Any] = {
        "command": command_line("bench.studies.batch_interference", args, DEFAULTS),
        "machine": machine_description(),
        "lines": args.lines,
        "rate": args.rate,
        "seconds": args.seconds,
        "runs": [],
        "uploads": {},
    }
    model = MODELS["gpu-like"]
    # Topics rotate every 10 s, as bench/sustained.py runs them: the embedded broker slows as
    # one topic fills (docs/production.md), which would otherwise weigh on the later runs.
    settings = load_settings(model).model_copy(
        update={"batch_max_lines": max(args.lines, 50_000), "topic_rotation_s": ROTATION_S}
    )
    with tempfile.TemporaryDirectory(prefix="brimful-interference-") as scratch:
        job_file, large_file = Path(scratch) / "job.jsonl", Path(scratch) / "large.jsonl"
        write_job(job_file, args.lines)
        write_large(large_file, args.upload_mb)
        stack = EmbeddedStack(settings, Path(scratch) / "stack", model_host_args=model.host_args)
        stack.start()
        try:
            job = upload(stack, job_file)
            results["uploads"]["the job's file"] = job
            results["uploads"]["a large file"] = upload(stack, large_file)
            report.save(results)
            for rep in range(args.reps):
                for case in ("alone", "beside the job") if rep % 2 == 0 else ("beside the job", "alone"):
                    if case == "alone":
                        report.step(results, interactive, stack, args.rate, args.seconds, True, case=case, rep=rep)
                    else:
                        report.step(
                            results, with_job, stack, job["file_id"], args.rate, args.seconds, case=case, rep=rep
                        )
        finally:
            stack.stop()
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
