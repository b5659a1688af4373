"""``brimful stats``: one model's totals and its batchers' partitions, live in the terminal
(``--model NAME``; without it, the default model)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any
from urllib.parse import quote

from brimful.commands.api_client import CommandError, add_api_argument, call


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("stats", help="show batching totals and live partition state")
    add_api_argument(parser)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    parser.add_argument("--once", action="store_true", help="print once and exit")
    parser.add_argument("--model", default=None, help="the model to show (default: the default model)")
    parser.set_defaults(handler=run)


def render(stats: dict[str, Any], previous: dict[str, Any] | None, interval: float) -> str:
    """The screen for one refresh: totals, rates since the last one, then each partition."""
    lines = []
    if "model" in stats:
        lines.append(f"model {stats['model']}")
    rows, batches = stats["rows_dispatched"], stats["batches_dispatched"]
    line = (
        f"batches {batches}  rows {rows}  mean rows/batch {stats['mean_rows_per_batch']:.2f}  "
        f"padded {stats['padded_slots']}  done {stats['tasks_done']}  failed {stats['tasks_failed']}"
    )
    lines.append(line)
    if previous is not None and interval > 0:
        lines.append(
            f"last {interval:g} s: {(rows - previous['rows_dispatched']) / interval:.1f} rows/s, "
            f"{(batches - previous['batches_dispatched']) / interval:.1f} batches/s"
        )
    reasons = {k.removeprefix("flushes_"): v for k, v in stats.items() if k.startswith("flushes_")}
    if reasons:
        lines.append("flushes by reason: " + "  ".join(f"{k} {v}" for k, v in reasons.items()))
    lines.append("")
    lines.append(f"{'batcher':<28} {'part':>4} {'rate/s':>9} {'budget ms':>10} {'pending':>8} {'in flight':>9}")
    for batcher in stats.get("batchers", []):
        for partition, state in batcher.get("partitions", {}).items():
            lines.append(
                f"{batcher['member'][:28]:<28} {partition:>4} {state['arrival_rate']:>9.1f} "
                f"{state['wait_budget_s'] * 1000:>10.1f} {state['pending']:>8} {state['in_flight']:>9}"
            )
    if not stats.get("batchers"):
        lines.append("(no batcher has reported in the last few seconds)")
        return "\n".join(lines)
    lines.append("")
    lines.append(
        f"{'batcher':<28} {'endpoint':<22} {'slots':>7} {'call ms':>8} {'breaker':>9} {'calls':>8} {'rows':>9}"
    )
    for batcher in stats["batchers"]:
        for endpoint in batcher.get("endpoints", []):
            lines.append(
                f"{batcher['member'][:28]:<28} {endpoint['url'][:22]:<22} "
                f"{endpoint['in_flight']:>3}/{endpoint['capacity']:<3} {endpoint['call_s'] * 1000:>8.1f} "
                f"{endpoint['breaker'] + (' (gone)' if endpoint['retired'] else ''):>9} {endpoint['calls']:>8} "
                f"{endpoint['rows']:>9}"
            )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    url = f"{args.api.rstrip('/')}/v1/stats"
    if args.model:
        url += f"?model={quote(args.model, safe='')}"
    previous = None
    try:
        while True:
            stats = call("GET", url, args.api_key)
            screen = render(stats, previous, args.interval)
            if args.once:
                print(screen)
                return 0
            sys.stdout.write("\x1b[2J\x1b[H" + screen + "\n")
            sys.stdout.flush()
            previous = stats
            time.sleep(args.interval)
    except CommandError as error:
        print(f"brimful stats: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
