"""Where a task's time goes: end-to-end latency split into its stages, beside Triton's
dynamic batcher at the same load.

    .venv/bin/python -m bench.studies.latency_stages [--shares 0.05,0.15,0.25] [--seconds 10] [--out-dir bench/results]

Starts the embedded stack with the GPU-like model (every call at least 20 ms) and, at each
share of its nominal ceiling (64 rows / 20 ms), offers open-loop Poisson load through
Brimful (``POST ?wait``) and then straight to the dynamic batcher. Each Brimful answer
carries ``submitted_at_ms`` (the API took the task) and ``updated_at_ms`` (its result was
stored); with the load generator's clock on the same machine they split each request into
*to the API*, *inside Brimful* and *back to the client*. The batcher's own histogram
``brimful_batch_stage_seconds`` splits *inside Brimful* further, a batch at a time: its rows'
submit-to-fetch (the API's write and the Kafka hop), their wait in the accumulator (the
flush policy), *prepare* (flush to the call: marking the tasks running, the slot's lease,
padding), the model call itself, and storing the results. Those are means over batches,
so at light load, where batches are thin, they weigh rows a little differently from the
end-to-end mean; *other* is what the batch means leave of the row mean. All figures are means.

Each load's figures go to ``latency_stages.json`` as soon as they are measured, and the
report ``latency_stages.md`` is rebuilt after each; ``--render`` rebuilds it from the JSON.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from bench.harness.dynamic_batcher import DynamicBatcherServer
from bench.harness.saved_report import SavedReport, add_report_arguments, machine_description, out_dir_flag, why
from bench.harness.throughput_plan import GPU_LIKE_CALL_MS
from bench.throughput import loadgen
from brimful.stack import EmbeddedStack, sample_sums, settings_on_free_ports

NOMINAL_CEILING = 64 / (GPU_LIKE_CALL_MS / 1000)  # rows/s of one endpoint sent only full batches


STAGES = ("to_batcher", "in_batch", "prepare", "call", "store")


def batcher_metrics(stack: EmbeddedStack) -> dict[str, float]:
    """The batcher's own figures: rows per call, and each stage's sum and count."""
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.settings.batcher_metrics_port}/metrics", timeout=5) as page:
        text = page.read().decode()
    sums = sample_sums(text)
    for stage in STAGES:
        staged = sample_sums(text, stage=stage)
        sums[f"{stage}_sum"] = staged.get("brimful_batch_stage_seconds_sum", 0.0)
        sums[f"{stage}_count"] = staged.get("brimful_batch_stage_seconds_count", 0.0)
    return sums


def measure(stack: EmbeddedStack, anchor: DynamicBatcherServer, share: float, seconds: float) -> dict[str, Any]:
    rate = share * NOMINAL_CEILING
    stack.empty_broker()  # each load starts on an empty broker: see EmbeddedStack.empty_broker
    before = batcher_metrics(stack)
    brimful = loadgen(stack, "brimful", seconds, rate=rate)
    after = batcher_metrics(stack)
    dynamic = loadgen(stack, "dynamic", seconds, rate=rate, anchor=anchor)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    rows = delta("brimful_batch_rows_count")
    stages = brimful.get("stages_mean_ms", {})
    inside = stages.get("in_brimful", float("nan"))
    staged = {f"{stage}_ms": delta(f"{stage}_sum") / max(1.0, delta(f"{stage}_count")) * 1000 for stage in STAGES}
    return {
        "share": share,
        "rate": rate,
        "brimful_mean_ms": brimful["mean_ms"],
        "brimful_p50_ms": brimful["p50_ms"],
        "to_api_ms": stages.get("to_api", float("nan")),
        "inside_ms": inside,
        **staged,
        "other_ms": inside - sum(staged.values()),
        "to_client_ms": stages.get("to_client", float("nan")),
        "rows_per_call": delta("brimful_batch_rows_sum") / rows if rows else float("nan"),
        "dynamic_mean_ms": dynamic["mean_ms"],
        "dynamic_p50_ms": dynamic["p50_ms"],
        "errors": brimful["errors"] + brimful["lost"] + dynamic["errors"] + dynamic["lost"],
    }


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Where a task's time goes (GPU-like model, one endpoint)",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. Means in ms; the model's own share "
        f"of each call is {GPU_LIKE_CALL_MS} ms.",
        "",
        "| load | rate /s | Brimful mean (p50) | to API | API to batcher | in batch (policy) | prepare | model call "
        "| store | other | back to client | rows per call | dynamic batcher mean (p50) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for step in results["steps"]:
        if "error" in step:
            lines.append(f"| {step['share']:.0%} | failed: {step['error']} ||||||||||||")
            continue
        if "prepare_ms" not in step:  # saved by an earlier version of this script
            continue
        lines.append(
            f"| {step['share']:.0%} | {step['rate']:.0f} | {step['brimful_mean_ms']:.1f} ({step['brimful_p50_ms']:.1f}) "
            f"| {step['to_api_ms']:.1f} | {step['to_batcher_ms']:.1f} | {step['in_batch_ms']:.1f} "
            f"| {step['prepare_ms']:.1f} | {step['call_ms']:.1f} | {step['store_ms']:.1f} | {step['other_ms']:.1f} "
            f"| {step['to_client_ms']:.1f} | {step['rows_per_call']:.1f} "
            f"| {step['dynamic_mean_ms']:.1f} ({step['dynamic_p50_ms']:.1f}) |"
        )
    errors = sum(step.get("errors", 0) for step in results["steps"])
    lines += ["", f"Errors or lost requests: {errors}.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shares", default="0.05,0.15,0.25", help="loads, as shares of the nominal ceiling")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each load's run")
    add_report_arguments(parser, "latency_stages")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "latency_stages", render)
    if args.render:
        report.render_again()
        return 0
    results: dict[str, Any] = {
        "command": "python -m bench.studies.latency_stages"
        + ("" if args.shares == "0.05,0.15,0.25" else f" --shares {args.shares}")
        + out_dir_flag(args.out_dir),
        "machine": machine_description(),
        "steps": [],
    }
    settings = settings_on_free_ports(rate_limit_per_s=0, tenant_max_in_flight=0, max_backlog=10_000_000)
    with tempfile.TemporaryDirectory(prefix="brimful-stages-") as scratch:
        stack = EmbeddedStack(settings, Path(scratch), model_host_args=("--call-ms", str(GPU_LIKE_CALL_MS)))
        anchor = DynamicBatcherServer(Path(scratch) / "dynamic", call_ms=GPU_LIKE_CALL_MS)
        stack.start()
        try:
            anchor.start()
            for share in (float(part) for part in args.shares.split(",")):
                try:
                    step = measure(stack, anchor, share, args.seconds)
                except Exception as error:  # recorded; the next load still runs
                    step = {"share": share, "error": why(error)}
                results["steps"].append(step)
                report.save(results)
        finally:
            anchor.stop()
            stack.stop()
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
