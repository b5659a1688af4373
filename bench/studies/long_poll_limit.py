"""A tenant past its long-poll limit, two revisions side by side: how fast it collects what is done.

    .venv/bin/python -m bench.studies.long_poll_limit --base REV [--head REV] [--config 2x1x1x1]
        [--rate 1200] [--limit 20] [--seconds 20] [--reps 2]

An API process holds at most ``tenant_max_long_polls`` waiting requests of one tenant. Past
it, a POST with ``?wait=`` is answered 202 at once and a client follows it up with
long-polling GETs (a revision before the follow-ups were held past the limit paused as a
429's ``Retry-After`` said). The load generator is one
tenant, so an open loop whose waiting requests outnumber a limit set low (``--limit``)
stands for a tenant whose rate, or a stall, passes the limit on a big machine. Each
revision runs that open loop on a stack of its own (the GPU-like model, its order swapped
every other repetition, as ``bench/studies/revisions.py`` lays revisions out), and the report gives
rows answered a second, p50 and p99 from the scheduled arrival, the requests answered 202
and followed up, and the GETs refused ``too_many_waiting``. Every run is saved as it ends.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.harness.saved_report import SavedReport, add_report_arguments, errors_footer, machine_description
from bench.scale import Shape, start
from bench.studies.compiled_api import importing_from
from bench.studies.revisions import WORKING_TREE, lay_out_pair, pair_command
from bench.throughput import loadgen
from brimful.stack import EmbeddedStack, read_sample_sums

DEFAULTS: dict[str, object] = {"config": "2x1x1x1", "rate": 1200.0, "limit": 20, "seconds": 20.0, "reps": 2}


def refused_waits(stack: EmbeddedStack) -> float:
    """GETs the API workers have refused ``too_many_waiting`` so far."""
    page = read_sample_sums(f"{stack.api_url}/metrics", reason="too_many_waiting")
    return page.get("brimful_refusals_total", 0.0)


def measure(shape: Shape, rate: float, limit: int, seconds: float) -> dict[str, Any]:
    """The open loop at ``rate`` on a stack whose API holds ``limit`` waiters a tenant."""
    with tempfile.TemporaryDirectory(prefix="brimful-long-poll-limit-") as scratch:
        stack = start(shape, Path(scratch), tenant_max_long_polls=limit)
        try:
            refused = refused_waits(stack)
            summary = loadgen(stack, "brimful", seconds, rate=rate)
            return {
                "rows_per_s": summary["achieved_rows_per_s"],
                "p50_ms": summary["p50_ms"],
                "p99_ms": summary["p99_ms"],
                "followed_up": summary.get("followed_up", 0),
                "refused": refused_waits(stack) - refused,
                "errors": summary["errors"] + summary["lost"],
                "first_error": summary["first_error"][:300],
            }
        finally:
            stack.stop()


def render(results: dict[str, Any]) -> str:
    lines = [
        f"# A tenant past its long-poll limit: {results['base']} and {results['head']} side by side",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. Configuration {results['config']} "
        f"(WxBxPxE as in scale.md), GPU-like model, an open loop at {results['rate']:g} rows/s for "
        f"{results['seconds']:g} s with `tenant_max_long_polls` {results['limit']} (one tenant), each revision on a "
        "stack of its own, their order swapped every other repetition. Followed up: requests answered 202 (the "
        "tenant's waiters full) and then long-polled; refused: GETs answered 429 `too_many_waiting`.",
        "",
        "| rep | revision | answered rows/s | p50 ms | p99 ms | followed up | refused | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        if "error" in run:
            continue  # named below the table
        lines.append(
            f"| {run['rep']} | {run['revision']} | {run['rows_per_s']:.0f} | {run['p50_ms']:.1f} "
            f"| {run['p99_ms']:.1f} | {run['followed_up']} | {run['refused']:.0f} | {run['errors']} |"
        )
    lines += errors_footer(results["runs"], lambda run: f"rep {run['rep']} {run['revision']}")
    return "\n".join(lines) + "\n"


def measure_in(tree: Path, shape: Shape, args: argparse.Namespace) -> dict[str, Any]:
    """One revision's run, its modules imported from ``tree``."""
    with importing_from(tree):
        return measure(shape, args.rate, args.limit, args.seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="a git revision")
    parser.add_argument("--head", default=WORKING_TREE, help="a git revision (default: the working tree)")
    parser.add_argument("--config", default=DEFAULTS["config"], help="WxBxPxE, as bench/scale.py takes it")
    parser.add_argument("--rate", type=float, default=DEFAULTS["rate"], help="open-loop rows/s")
    parser.add_argument("--limit", type=int, default=DEFAULTS["limit"], help="tenant_max_long_polls")
    parser.add_argument("--seconds", type=float, default=DEFAULTS["seconds"])
    parser.add_argument("--reps", type=int, default=DEFAULTS["reps"])
    add_report_arguments(parser, "long_poll_limit")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "long_poll_limit", render)
    if args.render:
        report.render_again()
        return 0
    shape = Shape.parse(args.config)
    base, head, command = pair_command("bench.studies.long_poll_limit", args, DEFAULTS)
    results: dict[str, Any] = {
        "command": command,
        "machine": machine_description(),
        "config": str(shape),
        "rate": args.rate,
        "limit": args.limit,
        "seconds": args.seconds,
        "base": base,
        "head": head,
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="brimful-long-poll-limit-trees-") as scratch:
        trees = lay_out_pair(args, Path(scratch))
        for number in range(1, args.reps + 1):
            order = [base, head] if number % 2 else [head, base]
            for name in order:
                print(f"rep {number}: {name}", flush=True)
                report.step(results, measure_in, trees[name], shape, args, rep=number, revision=name)
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
