"""Bulk submission, JSON against Arrow, side by side: tasks accepted a second and the API's
CPU a task, for the same rows sent as ``POST /v1/tasks:batch`` JSON and as an Arrow IPC
stream.

    .venv/bin/python -m bench.studies.bulk_formats [--rows 500] [--calls 20] [--reps 3] [--concurrency 4]

One stack (the reference model, one API worker, auth off). Each repetition sends, for each
format in turn (the order alternates), ``--calls`` bulk calls of ``--rows`` unique texts,
``--concurrency`` at a time, and measures from the first call to the last answer: tasks
accepted a second, and the API process's CPU (from /proc) a task. Between runs it waits
for every task to finish, so each run starts on an idle stack. The model's input is text,
the case where Arrow saves least (a numeric vector input saves a Python check per element).

Each run's figures go to ``bulk_formats.json`` as soon as they are measured and
``bulk_formats.md`` is rebuilt after each; ``--render`` rebuilds it from the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import pyarrow as pa
import pyarrow.ipc

from bench.harness.process_usage import usage
from bench.harness.saved_report import (
    SavedReport,
    add_report_arguments,
    command_line,
    errors_footer,
    machine_description,
    value_range,
)
from bench.throughput import process_pids
from brimful.stack import EmbeddedStack, settings_on_free_ports

DEFAULTS = {"rows": 500, "calls": 20, "reps": 3, "concurrency": 4}
FORMATS = ("json", "arrow")


def bodies(kind: str, rows: int, calls: int) -> list[tuple[bytes, str]]:
    """The calls' bodies and content type, made before the clock starts."""
    made = []
    for _ in range(calls):
        texts = [f"bulk {uuid.uuid4().hex}" for _ in range(rows)]
        if kind == "json":
            made.append((orjson.dumps({"tasks": [{"inputs": {"TEXT": text}} for text in texts]}), "application/json"))
        else:
            sink = pa.BufferOutputStream()
            table = pa.table({"TEXT": texts})
            with pyarrow.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            made.append((sink.getvalue().to_pybytes(), "application/vnd.apache.arrow.stream"))
    return made


async def send(stack: EmbeddedStack, calls: list[tuple[bytes, str]], concurrency: int) -> tuple[int, int, str]:
    """Send every call, ``concurrency`` at a time; (accepted, refused, the last task id)."""
    gate = asyncio.Semaphore(concurrency)
    accepted = refused = 0
    last = ""
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=120) as http:

        async def one(body: bytes, content_type: str) -> None:
            nonlocal accepted, refused, last
            async with gate:
                answer = await http.post("/v1/tasks:batch", content=body, headers={"Content-Type": content_type})
            if answer.status_code != 200:
                refused += 1
                return
            for result in answer.json()["results"]:
                if "task_id" in result:
                    accepted += 1
                    last = result["task_id"]
                else:
                    refused += 1

        await asyncio.gather(*(one(body, content_type) for body, content_type in calls))
    return accepted, refused, last


async def settled(stack: EmbeddedStack, task_id: str, timeout_s: float = 300) -> None:
    """Until the run's last task is final: the stack is idle for the next run."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=60) as http:
        while time.monotonic() < deadline:
            answer = await http.get(f"/v1/tasks/{task_id}?wait=20")
            if answer.status_code == 200 and answer.json()["status"] in ("done", "failed"):
                return
    raise TimeoutError("the run's tasks did not finish")


def run_once(stack: EmbeddedStack, kind: str, rows: int, calls: int, concurrency: int) -> dict[str, Any]:
    prepared = bodies(kind, rows, calls)
    pids = process_pids(stack, "api")
    before, started = usage(pids), time.perf_counter()
    accepted, refused, last = asyncio.run(send(stack, prepared, concurrency))
    elapsed = time.perf_counter() - started
    cpu_s = usage(pids).cpu_s - before.cpu_s
    if last:
        asyncio.run(settled(stack, last))
    return {
        "format": kind,
        "tasks": accepted,
        "refused": refused,
        "seconds": elapsed,
        "tasks_per_s": accepted / elapsed if elapsed else 0.0,
        "api_us_per_task": cpu_s / max(1, accepted) * 1e6,
        "body_bytes_per_task": sum(len(body) for body, _ in prepared) / (rows * calls),
        "errors": refused,
    }


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Bulk submission: JSON against Arrow (reference model, text input)",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. Each run: {results['calls']} calls of "
        f"{results['rows']} unique texts to `POST /v1/tasks:batch`, {results['concurrency']} at a time, one API "
        "worker; the formats alternate; each cell is the range over the repetitions.",
        "",
        "| format | tasks accepted /s | API CPU us a task | body bytes a task | runs |",
        "|---|---|---|---|---|",
    ]
    runs = [run for run in results["runs"] if "error" not in run]
    for kind in FORMATS:
        same = [run for run in runs if run["format"] == kind]
        if same:
            lines.append(
                f"| {kind} | {value_range([r['tasks_per_s'] for r in same], 0)} "
                f"| {value_range([r['api_us_per_task'] for r in same], 1)} "
                f"| {value_range([r['body_bytes_per_task'] for r in same], 1)} | {len(same)} |"
            )
    pairs = list(zip([r for r in runs if r["format"] == "json"], [r for r in runs if r["format"] == "arrow"]))
    if pairs:
        ratios = [
            arrow["tasks_per_s"] / json_run["tasks_per_s"] for json_run, arrow in pairs if json_run["tasks_per_s"]
        ]
        cpu = [
            json_run["api_us_per_task"] / arrow["api_us_per_task"]
            for json_run, arrow in pairs
            if arrow["api_us_per_task"]
        ]
        lines += [
            "",
            f"Arrow / JSON, run by run: tasks a second {value_range(ratios, 2)}x; "
            f"API CPU a task, JSON / Arrow {value_range(cpu, 2)}x.",
        ]
    lines += errors_footer(results["runs"], lambda run: f"{run['format']}, repetition {run['rep']}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=DEFAULTS["rows"], help="tasks a call")
    parser.add_argument("--calls", type=int, default=DEFAULTS["calls"], help="calls a run")
    parser.add_argument("--reps", type=int, default=DEFAULTS["reps"], help="repetitions of each format")
    parser.add_argument("--concurrency", type=int, default=DEFAULTS["concurrency"], help="calls at once")
    add_report_arguments(parser, "bulk_formats")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "bulk_formats", render)
    if args.render:
        report.render_again()
        return 0
    results: dict[str, Any] = {
        "command": command_line("bench.studies.bulk_formats", args, DEFAULTS),
        "machine": machine_description(),
        "rows": args.rows,
        "calls": args.calls,
        "concurrency": args.concurrency,
        "runs": [],
    }
    # No tenant limits: the run measures the front door, not the rate limiter.
    settings = settings_on_free_ports(
        api_workers=1, max_bulk_tasks=max(1000, args.rows), tenant_max_in_flight=0, rate_limit_per_s=0
    )
    with tempfile.TemporaryDirectory(prefix="brimful-bulk-") as scratch:
        stack = EmbeddedStack(settings, Path(scratch))
        stack.start()
        try:
            for rep in range(args.reps):
                for kind in FORMATS if rep % 2 == 0 else FORMATS[::-1]:
                    report.step(
                        results, run_once, stack, kind, args.rows, args.calls, args.concurrency, format=kind, rep=rep
                    )
        finally:
            stack.stop()
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
