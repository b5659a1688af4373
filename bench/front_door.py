"""The API's CPU a task on each of its lanes, beside the bare HTTP server's floor, in one run.

    .venv/bin/python -m bench.front_door [--config 2x1x1x1] [--seconds 10] [--reps 3]

Each repetition measures the floor (``bench/throughput.py``'s: uvicorn answering the same
POST with a constant 202, bare and behind a FastAPI route, as many workers as the API),
then, alternately, each on a stack of its own (GPU-like model, ``bench/scale.py``'s
shape): a closed loop of 256 clients with the two task routes on

- ``direct``: answered inside the HTTP protocol (``api/http/direct_lane.py``, the default);
- ``fastapi``: through ASGI and FastAPI's own routes (``api_direct_lane`` off).

For each: rows/s, p50/p99, and the API's and the batcher's CPU per completed task; the
API's against the bare floor of the same repetition is #36's ratio. Figures go to
``front_door.json`` as they are measured; ``--render`` rebuilds the report.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.harness.saved_report import (
    SavedReport,
    add_report_arguments,
    command_line,
    errors_footer,
    machine_description,
    why,
)
from bench.harness.throughput_plan import CLIENTS
from bench.scale import LANES, Shape, role_cpu_s, start
from bench.throughput import loadgen, measure_floor, stats


def measure_lane(shape: Shape, seconds: float, settings: dict[str, object]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="brimful-front-door-") as scratch:
        stack = start(shape, Path(scratch), **settings)
        try:
            loadgen(stack, "brimful", 3.0, clients=CLIENTS)  # warm-up: connections, lazy imports, caches
            api, batcher, redis = role_cpu_s(stack, "api"), role_cpu_s(stack, "batcher"), role_cpu_s(stack, "redis")
            done = stats(stack).get("tasks_done", 0)
            summary = loadgen(stack, "brimful", seconds, clients=CLIENTS)
            tasks = max(1, stats(stack).get("tasks_done", 0) - done)
            return {
                "rows_per_s": summary["achieved_rows_per_s"],
                "p50_ms": summary["p50_ms"],
                "p99_ms": summary["p99_ms"],
                "api_us_per_task": (role_cpu_s(stack, "api") - api) / tasks * 1e6,
                "batcher_us_per_task": (role_cpu_s(stack, "batcher") - batcher) / tasks * 1e6,
                "redis_us_per_task": (role_cpu_s(stack, "redis") - redis) / tasks * 1e6,
                "errors": summary["errors"] + summary["lost"],
            }
        finally:
            stack.stop()


def lane_rows(results: dict[str, Any]) -> list[str]:
    """The report's table: for each repetition's lanes, its floor, rows/s, latency, the API's
    CPU a task and its ratio to the bare floor of the same repetition, the batcher's CPU a
    task; then errors and failed runs."""
    lines = [
        "| rep | floor: bare / FastAPI us | lane | rows/s | p50 ms | p99 ms | API us a task | x floor "
        "| batcher us a task |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rep in results["runs"]:
        floor = rep.get("floor", {})
        bare = floor.get("asgi/raw", {}).get("server_cpu_us_per_request")
        framework = floor.get("fastapi/raw", {}).get("server_cpu_us_per_request")
        floor_cell = f"{bare:.0f} / {framework:.0f}" if bare and framework else "-"
        for lane in rep.get("lanes", []):
            if "error" in lane:
                continue  # named below the table
            ratio = f"{lane['api_us_per_task'] / bare:.1f}" if bare else "-"
            lines.append(
                f"| {rep['rep']} | {floor_cell} | {lane['lane']} | {lane['rows_per_s']:.0f} | {lane['p50_ms']:.1f} "
                f"| {lane['p99_ms']:.1f} | {lane['api_us_per_task']:.0f} | {ratio} | {lane['batcher_us_per_task']:.0f} |"
            )
    lanes = [{"rep": rep["rep"], **lane} for rep in results["runs"] for lane in rep.get("lanes", [])]
    return lines + errors_footer(lanes, lambda lane: f"rep {lane['rep']}, {lane['lane']}")


def render(results: dict[str, Any]) -> str:
    lines = [
        "# The front door: the API's CPU a task on each lane, against the bare server",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. Configuration {results['config']} "
        "(WxBxPxE as in scale.md), GPU-like model, closed loop of 256 clients after a 3 s warm-up, each lane on a "
        "stack of its own, alternated within each repetition. Floor: uvicorn with as many workers answering the "
        "same POST with a constant 202 and no I/O (bare ASGI; behind a FastAPI route), measured at the start of "
        "the same repetition. x floor: the API's CPU a task over the bare floor's CPU a request.",
        "",
        *lane_rows(results),
    ]
    return "\n".join(lines) + "\n"


def measure_floor_of(rep: dict[str, Any], shape: Shape, report: SavedReport, results: dict[str, Any]) -> None:
    """The repetition's bare and FastAPI floors, into ``rep["floor"]`` (a failure is
    recorded there, and the lanes still run)."""
    with tempfile.TemporaryDirectory(prefix="brimful-floor-") as scratch:
        try:
            measure_floor(rep["floor"], Path(scratch), 6.0, shape.api_workers, lambda: report.save(results))
        except Exception as error:
            rep["floor"]["failed"] = {"why": why(error)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="2x1x1x1", help="WxBxPxE, as bench/scale.py takes it")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--lanes", default=",".join(LANES), help="comma-separated, each rep in turn")
    add_report_arguments(parser, "front_door")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "front_door", render)
    if args.render:
        report.render_again()
        return 0
    shape = Shape.parse(args.config)
    results: dict[str, Any] = {
        "command": command_line(
            "bench.front_door",
            args,
            {"config": "2x1x1x1", "seconds": 10.0, "reps": 3, "lanes": ",".join(LANES)},
        ),
        "machine": machine_description(),
        "config": str(shape),
        "runs": [],
    }
    for number in range(1, args.reps + 1):
        rep: dict[str, Any] = {"rep": number, "floor": {}, "lanes": []}
        results["runs"].append(rep)
        measure_floor_of(rep, shape, report, results)
        for lane in args.lanes.split(","):  # alternated, so a noisy minute falls on each alike
            try:
                rep["lanes"].append({"lane": lane, **measure_lane(shape, args.seconds, LANES[lane])})
            except Exception as error:
                rep["lanes"].append({"lane": lane, "error": why(error)})
            report.save(results)
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
