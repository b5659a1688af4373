"""Sustained load on the embedded stack: does a minute late in a long run look like the first?

    .venv/bin/python -m bench.sustained [--minutes 10] [--share 0.8] [--model gpu-like]
        [--rotation-s 10] [--broker tansu|kafka] [--revision REV]

Starts the embedded stack as ``make bench`` runs it (two API workers, one batcher, the
model with one instance and a second slot), finds the rate Brimful sustains with a closed
loop of 256 clients for 10 s, empties the broker, then offers ``--share`` of that rate as
open-loop Poisson arrivals for ``--minutes``, one load-generator process a minute. After
each minute it records the minute's p50 / p99 (from the scheduled arrival), the rows a
second answered, errors and lost requests, the broker's and Redis's resident memory and the
broker's CPU (from /proc), and the CPU a task of each Brimful process and server, so what
grows over a run shows where. The closed loop's own CPU a task is read the same way, so
the report sets the open loop's all-in CPU a task (API, batcher, broker, Redis) against
the closed loop's of the same run, and each minute's p99 against its p50. The report
compares the last minute with the first.

Each minute goes to ``sustained.json`` as soon as it is measured and ``sustained.md`` is
rebuilt after each; a run cut short keeps its minutes. ``--render`` rebuilds the report.
``--broker kafka`` runs it on one Apache Kafka node instead of the embedded Tansu; with
``--rotation-s 0`` there, it shows whether Kafka needs topic rotation (Tansu does).
``--revision REV`` runs the stack of that git revision (laid out from git as
``bench/studies/revisions.py`` does) under this harness: a before beside an after.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.harness.broker_choice import BROKERS, add_broker_argument, broker_label
from bench.harness.load_settings import load_settings
from bench.harness.process_usage import resident_mb
from bench.harness.saved_report import SavedReport, add_report_arguments, command_line, machine_description, why
from bench.harness.throughput_plan import CLIENTS, MODELS
from bench.scale import ALL_IN, role_cpu_s
from bench.studies.compiled_api import importing_from
from bench.studies.revisions import WORKING_TREE, lay_out, revision_name
from bench.throughput import loadgen, process_pids, stats
from brimful.core.topic_generations import MEASURED_PERIOD_S
from brimful.stack import EmbeddedStack

# Topics rotate every 10 s: one topic collapses within minutes (bench/results/sustained-one-topic/).
DEFAULTS: dict[str, Any] = {
    "minutes": 10,
    "share": 0.8,
    "model": "gpu-like",
    "rotation_s": MEASURED_PERIOD_S,
    "broker": "tansu",
    "revision": WORKING_TREE,
}
# Whose CPU a task each minute records (bench/scale.py's roles).
ROLES = ("api", "batcher", "broker", "redis", "model")


def all_in_us(us_per_task: dict[str, float]) -> float:
    return sum(us_per_task[role] for role in ALL_IN)


def cost_lines(results: dict[str, Any]) -> list[str]:
    """The open loop's all-in CPU a task against the closed loop's, and its tail against
    its median: the ratios the performance targets name, within this one run."""
    closed = results.get("closed_us_per_task")
    minutes = [m for m in results["minutes"] if m.get("us_per_task")]
    if not closed or not minutes:
        return []
    tasks = sum(m["rows_per_s"] * 60.0 for m in minutes)
    spent = sum(all_in_us(m["us_per_task"]) * m["rows_per_s"] * 60.0 for m in minutes)
    open_us = spent / max(1.0, tasks)
    tails = [m["p99_ms"] / m["p50_ms"] for m in minutes if m["p50_ms"]]
    return [
        "",
        f"All-in CPU a task (API + batcher + broker + Redis): closed loop {all_in_us(closed):.0f} us "
        f"({' / '.join(f'{closed[r]:.0f}' for r in ALL_IN)}), open loop {open_us:.0f} us over its minutes: "
        f"**{open_us / max(1e-9, all_in_us(closed)):.2f}x** the closed loop's. p99 / p50 by minute: "
        f"{', '.join(f'{t:.1f}' for t in tails)} (median {statistics.median(tails):.1f}).",
    ]


@contextlib.contextmanager
def stack_of(revision: str, scratch: Path) -> Iterator[None]:
    """Stacks started inside run ``revision`` (the working tree: the editable install)."""
    if revision == WORKING_TREE:
        yield
        return
    tree = scratch / "revision"
    lay_out(revision, tree)
    with importing_from(tree):
        yield


def rotation(results: dict[str, Any]) -> str:
    period = results.get("rotation_s", 0)
    return f"a new topic generation every {period:g} s" if period else "one topic"


def slowest_seconds(results: dict[str, Any], count: int = 8) -> list[str]:
    """The seconds of arrivals with the highest p99 over the run, each with how far into
    its topic generation it began (a stall that follows the turn of a generation shows as
    the same few seconds after it), then p99 by that second of the generation."""
    seconds = [second for minute in results["minutes"] for second in minute.get("by_second", [])]
    if not seconds:
        return []
    period = results.get("rotation_s", 0)
    start = seconds[0]["t"]
    lines = [
        "",
        f"The {count} seconds of arrivals with the highest p99, of {len(seconds)}:",
        "",
        "| second of the run | second of its topic generation | requests | p99 ms | slowest ms |",
        "|---|---|---|---|---|",
    ]
    for second in sorted(seconds, key=lambda s: -s["p99_ms"])[:count]:
        phase = f"{second['t'] % period:.0f}" if period else "-"
        lines.append(
            f"| {second['t'] - start} | {phase} | {second['n']} | {second['p99_ms']:.0f} | {second['max_ms']:.0f} |"
        )
    if period:
        by_phase: dict[int, list[float]] = {}
        for second in seconds:
            by_phase.setdefault(int(second["t"] % period), []).append(second["p99_ms"])
        cells = [
            f"{phase}: {statistics.median(values):.0f} / {max(values):.0f}"
            for phase, values in sorted(by_phase.items())
        ]
        lines += ["", "p99 ms by the second of the topic generation the requests arrived in (median / highest):"]
        lines += ["; ".join(cells) + "."]
    return lines


def render(results: dict[str, Any]) -> str:
    minutes = results["minutes"]
    lines = [
        "# Sustained open-loop load on the embedded stack",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. Broker: "
        f"{broker_label(results.get('broker', 'tansu'))}. Model: {results['model']}. The closed "
        f"loop ({CLIENTS} clients, 10 s) sustained {results.get('saturation', 0):.0f} rows/s; then "
        f"{results['offered']:.0f}/s offered ({results['share']:.0%} of it), open-loop Poisson "
        f"({'on the same broker' if results.get('broker') == 'kafka' else 'on an emptied broker'}, producer linger {results.get('linger_ms', 0)} ms, {rotation(results)}), "
        "one load-generator process a minute; ms from the scheduled arrival. Errors: requests not answered "
        "done (a 202 still queued when the client's inline wait ended, or a refusal); lost: no answer 20 s "
        "after the minute (the load generator's count, not tasks Brimful lost). Broker: its resident memory "
        "at the minute's end and the share of a core it spent during the minute. us a task: each process's "
        "CPU during the minute over the tasks answered in it (runs before this column have none).",
        "",
        "| minute | rows/s | p50 ms | p99 ms | errors | lost | broker MB | broker CPU | Redis MB "
        "| us a task: API / batcher / broker / Redis / model |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for minute in minutes:
        spent = minute.get("us_per_task")
        spent_cell = " / ".join(f"{spent[role]:.0f}" for role in ROLES) if spent else "-"
        redis_cell = f"{minute['redis_mb']:.0f}" if "redis_mb" in minute else "-"
        lines.append(
            f"| {minute['minute']} | {minute['rows_per_s']:.0f} | {minute['p50_ms']:.1f} | {minute['p99_ms']:.1f} "
            f"| {minute['errors']} | {minute['lost']} | {minute['broker_mb']:.0f} | {minute['broker_cpu']:.2f} "
            f"| {redis_cell} | {spent_cell} |"
        )
    if len(minutes) >= 2:
        first, last = minutes[0], minutes[-1]
        lines += [
            "",
            f"Last minute against the first: p99 {last['p99_ms'] / first['p99_ms']:.2f}x, broker memory "
            f"{last['broker_mb'] / first['broker_mb']:.2f}x, broker CPU {last['broker_cpu'] / max(first['broker_cpu'], 1e-9):.2f}x. "
            f"Lost over the run: {sum(m['lost'] for m in minutes)}; errors: {sum(m['errors'] for m in minutes)}.",
        ]
    lines += cost_lines(results)
    lines += slowest_seconds(results)
    errors = [m for m in minutes if m.get("first_error")]
    if errors:
        lines += ["", f"First error of minute {errors[0]['minute']}: {errors[0]['first_error']}"]
    if results.get("error"):
        lines += ["", f"The run stopped early: {results['error']}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=DEFAULTS["minutes"], help="minutes of open-loop load")
    parser.add_argument("--share", type=float, default=DEFAULTS["share"], help="share of the sustained rate offered")
    parser.add_argument("--model", choices=sorted(MODELS), default=DEFAULTS["model"])
    parser.add_argument(
        "--rotation-s", type=float, default=DEFAULTS["rotation_s"], help="topic generation period (0: one topic)"
    )
    add_broker_argument(parser)
    parser.add_argument(
        "--revision", default=WORKING_TREE, help="the git revision whose stack runs (default: this one)"
    )
    add_report_arguments(parser, "sustained")
    args = parser.parse_args()
    # Resolved now: with --revision the stack runs from a folder of its own (the command keeps it as given).
    report = SavedReport(args.out_dir.resolve(), "sustained", render)
    if args.render:
        report.render_again()
        return 0
    if args.revision != WORKING_TREE:
        args.revision = revision_name(args.revision)
    command = command_line("bench.sustained", args, DEFAULTS)
    results: dict[str, Any] = {
        "command": command,
        "machine": machine_description(),
        "model": args.model,
        "broker": args.broker,
        "share": args.share,
        "offered": 0.0,
        "minutes": [],
    }
    model = MODELS[args.model]
    settings = load_settings(model, production=True, result_ttl_s=900, topic_rotation_s=args.rotation_s)
    results["linger_ms"] = settings.kafka_linger_ms  # BRIMFUL_KAFKA_LINGER_MS: bigger, fewer broker batches
    results["rotation_s"] = settings.topic_rotation_s  # the broker keeps recent records only
    with tempfile.TemporaryDirectory(prefix="brimful-sustained-") as scratch, stack_of(args.revision, Path(scratch)):
        stack = EmbeddedStack(
            settings, Path(scratch), model_host_args=model.host_args, kafka_version=BROKERS[args.broker]
        )
        stack.start()
        try:
            before = {role: role_cpu_s(stack, role) for role in ROLES}
            done_before = stats(stack).get("tasks_done", 0)
            results["saturation"] = loadgen(stack, "brimful", 10.0, clients=CLIENTS)["achieved_rows_per_s"]
            closed_tasks = max(1, stats(stack).get("tasks_done", 0) - done_before)
            results["closed_us_per_task"] = {
                role: (role_cpu_s(stack, role) - before[role]) / closed_tasks * 1e6 for role in ROLES
            }
            results["offered"] = args.share * results["saturation"]
            stack.empty_broker()
            for minute in range(1, args.minutes + 1):
                before = {role: role_cpu_s(stack, role) for role in ROLES}
                # No settling between minutes: the load goes on as it would.
                summary = loadgen(
                    stack,
                    "brimful",
                    60.0,
                    rate=results["offered"],
                    settle_first=False,
                    extra=("--warmup", "0", "--timeline"),
                )
                spent = {role: role_cpu_s(stack, role) - before[role] for role in ROLES}
                tasks = max(1.0, summary["achieved_rows_per_s"] * 60.0)
                results["minutes"].append(
                    {
                        "minute": minute,
                        "rows_per_s": summary["achieved_rows_per_s"],
                        "p50_ms": summary["p50_ms"],
                        "p99_ms": summary["p99_ms"],
                        "errors": summary["errors"],
                        "lost": summary["lost"],
                        "first_error": summary["first_error"][:200],
                        "broker_mb": resident_mb(process_pids(stack, "broker")),
                        "broker_cpu": spent["broker"] / 60.0,
                        "redis_mb": resident_mb(process_pids(stack, "redis")),
                        "by_second": summary.get("by_second", []),
                        "us_per_task": {role: cpu / tasks * 1e6 for role, cpu in spent.items()},
                    }
                )
                report.save(results)
        except Exception as error:  # what was measured stays, with why the run stopped
            results["error"] = why(error)
            report.save(results)
        finally:
            stack.stop()
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
