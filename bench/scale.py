"""How Brimful scales: API workers x batchers x partitions x endpoints, on the GPU-like model.

    .venv/bin/python -m bench.scale [--configs 1x1x1x1,2x1x1x1,1x2x2x1,2x2x2x2] [--seconds 10]
        [--clients 256] [--load-processes 1] [--open-rate 0] [--rotation-s 0] [--group-gap-ms 0] [--unacknowledged 1] [--set NAME=VALUE ...]
        [--lane direct|fast|fastapi] [--brokers tansu,kafka]

A configuration ``WxBxPxE`` is W API workers, B batchers (of the one model) sharing a
requests topic of P partitions, and E model endpoints (each a Triton server with one
instance of the GPU-like model, every call at least 20 ms, and a second slot that queues
the next call). For each, in order, on a stack of its own:

1. a closed loop of ``--clients`` clients finds the rows a second it sustains, with the CPU
   every process spent per completed task (API workers, batchers, broker, Redis, model
   hosts, from /proc);
2. an open loop at 80% of that (or at ``--open-rate``), on an empty broker: p50 and p99
   from the scheduled arrival.

A closed loop sustains at most clients / latency: 256 clients at 80 ms cap it near 3,200
a second, so a large machine needs more clients, and ``--load-processes`` to send them
(one Python process tops out at a few thousand requests a second).

With ``--brokers tansu,kafka`` each configuration runs on the embedded Tansu, then on one
Apache Kafka node (``bench/harness/broker_choice.py``), one after the other in the same run, and
the report sets Kafka's figures against Tansu's for each.

The report gives each configuration's rate against the first one's (on the same broker): with the first
``1x1x1x1``, the efficiency of an added API worker or batcher is that ratio over the
workers (or batchers) added. Each configuration's figures go to ``scale.json`` as soon as
they are measured and ``scale.md`` is rebuilt after each; a configuration that fails is
recorded with its error and the next one still runs. ``--render`` rebuilds the report.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.broker_choice import BROKERS, broker_label
from bench.harness.load_settings import load_settings
from bench.harness.process_usage import usage
from bench.harness.saved_report import (
    SavedReport,
    add_report_arguments,
    command_line,
    errors_footer,
    machine_description,
    why,
)
from bench.harness.throughput_plan import CLIENTS, MODELS
from bench.throughput import loadgen, process_pids, stats
from brimful.core.settings import Settings, changed_settings
from brimful.stack import EmbeddedStack, free_port, read_sample_sums

DEFAULT_CONFIGS = "1x1x1x1,2x1x1x1,1x2x2x1,2x2x2x2"
OPEN_LOOP_SHARE = 0.8
# The seed's latency goal: the report counts the open loop's seconds whose p99 passed it.
SLOW_SECOND_MS = 500.0
# What each process is counted as in the report.
ROLES = ("api", "batcher", "broker", "redis", "model")


@dataclass(frozen=True)
class Shape:
    """One configuration: API workers, batchers, partitions, endpoints."""

    api_workers: int
    batchers: int
    partitions: int
    endpoints: int

    @classmethod
    def parse(cls, text: str) -> Shape:
        parts = text.lower().split("x")
        if len(parts) != 4 or not all(part.isdigit() and int(part) >= 1 for part in parts):
            raise ValueError(f"a configuration is WxBxPxE with each at least 1, not {text!r}")
        return cls(*(int(part) for part in parts))

    def __str__(self) -> str:
        return f"{self.api_workers}x{self.batchers}x{self.partitions}x{self.endpoints}"


def role_of(process: str) -> str:
    """The report's role of a managed process of the embedded stack."""
    if process.startswith("batcher"):
        return "batcher"
    if process.startswith("triton"):
        return "model"
    return process


def start(
    shape: Shape,
    scratch: Path,
    model_host_python: str = sys.executable,
    broker: str = "tansu",
    **overrides: object,
) -> EmbeddedStack:
    """A stack of ``shape`` on ``broker`` (``BROKERS``), every batcher in the group;
    ``overrides``: settings, e.g. ``topic_rotation_s`` (the broker then keeps recent
    records only)."""
    model = MODELS["gpu-like"]
    settings = load_settings(
        model, api_workers=shape.api_workers, topic_partitions=shape.partitions, production=True, **overrides
    )
    extra = [f"127.0.0.1:{free_port()}" for _ in range(shape.endpoints - 1)]
    settings = changed_settings(settings, triton_url=",".join([settings.triton_url, *extra]))
    stack = EmbeddedStack(
        settings,
        scratch,
        model_host_args=model.host_args,
        model_host_python=model_host_python,
        kafka_version=BROKERS[broker],
    )
    stack.start()
    try:
        for _ in range(shape.batchers - 1):
            stack.start_batcher()
        stack.wait_for_batchers()
    except BaseException:
        stack.stop()
        raise
    return stack


def group_sums(stack: EmbeddedStack) -> tuple[float, float]:
    """(submissions, group commits) the API workers have counted so far: their ratio is the
    tasks a group commit (one Redis round trip, one send) carried."""
    page = read_sample_sums(f"{stack.api_url}/metrics")
    return page.get("brimful_submit_group_size_sum", 0.0), page.get("brimful_submit_group_size_count", 0.0)


def cpu_s(stack: EmbeddedStack, name: str) -> float:
    """CPU seconds the stack's process ``name`` (with its children) has spent so far."""
    return usage(process_pids(stack, name)).cpu_s


def role_cpu_s(stack: EmbeddedStack, role: str) -> float:
    """CPU seconds the stack's processes of ``role`` (``ROLES``) have spent so far."""
    return sum(cpu_s(stack, name) for name in stack.process_names() if role_of(name) == role)


@dataclass(frozen=True)
class RunOptions:
    """How each configuration runs: closed-loop clients, load-generating processes, the
    open loop's rate (0: 80% of what the closed loop sustained), the model hosts' Python,
    the requests topic's rotation period (0: one topic), the API's least gap between group
    commits (0: none), the API's lane for the task routes (``LANES``), the most group
    commits an API process has out at the broker unanswered (0: no bound), and any other
    settings by name (``--set``)."""

    clients: int = CLIENTS
    processes: int = 1
    open_rate: float = 0.0
    model_host_python: str = sys.executable
    rotation_s: float = 0.0
    group_gap_ms: float = 0.0
    lane: str = "direct"
    broker: str = "tansu"
    unacknowledged: int = 1
    settings: tuple[tuple[str, str], ...] = ()


# The API's lanes for the two task routes, by the settings that choose them.
LANES: dict[str, dict[str, object]] = {
    "direct": {},  # inside the HTTP protocol (api/http/direct_lane.py), the default
    "fastapi": {"api_direct_lane": False},  # through ASGI and FastAPI's own routes
}


def measure(shape: Shape, seconds: float, options: RunOptions) -> dict[str, Any]:
    """Saturation with CPU a task by role, then the open loop at 80% of it."""
    with tempfile.TemporaryDirectory(prefix="brimful-scale-") as scratch:
        overrides = {
            "topic_rotation_s": options.rotation_s,
            "submit_group_gap_ms": options.group_gap_ms,
            "submit_groups_unacknowledged": options.unacknowledged,
            **LANES[options.lane],
            **dict(options.settings),
        }
        stack = start(shape, Path(scratch), options.model_host_python, options.broker, **overrides)
        try:
            names = stack.process_names()
            before = {name: cpu_s(stack, name) for name in names}
            counted = stats(stack)
            closed = loadgen(stack, "brimful", seconds, clients=options.clients, processes=options.processes)
            after = stats(stack)
            tasks = max(1, after.get("tasks_done", 0) - counted.get("tasks_done", 0))
            calls = after.get("batches_dispatched", 0) - counted.get("batches_dispatched", 0)
            rows = after.get("rows_dispatched", 0) - counted.get("rows_dispatched", 0)
            cpu_us = dict.fromkeys(ROLES, 0.0)
            for name in names:
                spent = cpu_s(stack, name) - before[name]
                cpu_us[role_of(name)] = cpu_us.get(role_of(name), 0.0) + spent / tasks * 1e6
            stack.empty_broker()
            offered = options.open_rate or OPEN_LOOP_SHARE * closed["achieved_rows_per_s"]
            open_before = {name: cpu_s(stack, name) for name in names}
            (submitted, groups), done = group_sums(stack), stats(stack)
            opened = loadgen(
                stack, "brimful", seconds, rate=offered, processes=options.processes, extra=("--timeline",)
            )
            open_tasks = max(1, stats(stack).get("tasks_done", 0) - done.get("tasks_done", 0))
            open_us = dict.fromkeys(ROLES, 0.0)
            for name in names:
                open_us[role_of(name)] += (cpu_s(stack, name) - open_before[name]) / open_tasks * 1e6
            submitted_after, groups_after = group_sums(stack)
        finally:
            stack.stop()
    return {
        "config": str(shape),
        "broker": options.broker,
        "rows_per_s": closed["achieved_rows_per_s"],
        "closed_p99_ms": closed["p99_ms"],
        "rows_per_call": rows / calls if calls else 0.0,
        "cpu_us_per_task": cpu_us,
        "open_offered": offered,
        "open_rows_per_s": opened["achieved_rows_per_s"],
        "open_errors": opened["errors"] + opened["lost"],
        "open_p50_ms": opened["p50_ms"],
        "open_p99_ms": opened["p99_ms"],
        "open_by_second": opened.get("by_second", []),
        "open_broker_us": open_us["broker"],
        "open_cpu_us_per_task": open_us,
        "open_group_mean": (submitted_after - submitted) / max(1.0, groups_after - groups),
        "errors": closed["errors"] + closed["lost"] + opened["errors"] + opened["lost"],
        "followed_up": {"closed": closed.get("followed_up", 0), "open": opened.get("followed_up", 0)},
        "first_errors": [loop["first_error"][:300] for loop in (closed, opened) if loop["first_error"]],
    }


def worst_second(timeline: list[dict[str, float]]) -> dict[str, float]:
    """The second of the open loop's arrivals with the highest p99 (``{}`` without a
    timeline): a tail from a stall shows as a few bad seconds, one from overload as many."""
    return max(timeline, key=lambda second: second["p99_ms"], default={})


def seconds_over(timeline: list[dict[str, float]], p99_ms: float) -> int:
    """How many of the open loop's seconds of arrivals had a p99 above ``p99_ms``."""
    return sum(1 for second in timeline if second["p99_ms"] > p99_ms)


def broker_of(run: dict[str, Any]) -> str:
    return str(run.get("broker", "tansu"))  # runs saved before brokers were a choice ran on Tansu


def render(results: dict[str, Any]) -> str:
    runs = [run for run in results["runs"] if "error" not in run]
    firsts: dict[str, dict[str, Any]] = {}  # each broker's first configuration
    for run in runs:
        firsts.setdefault(broker_of(run), run)
    lines = [
        "# Scaling: API workers x batchers x partitions x endpoints (GPU-like model)",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. A configuration WxBxPxE is W API "
        "workers, B batchers on P partitions, E endpoints (one model instance each, 20 ms a call). Rows/s: a "
        f"closed loop of {results.get('clients', CLIENTS)} clients for {results['seconds']:g} s"
        f" (load-generating processes: {results.get('load_processes', 1)}); x first: that against the first "
        "configuration; per added: (x first - 1) over the API workers and batchers added; rows a call: real rows "
        f"a model call carried in the closed loop. Open loop: Poisson at {open_loop_rate(results)} on an empty "
        "broker (Tansu restarted empty; Kafka keeps what it stored; offered and answered rows/s in the table), ms from the scheduled arrival; worst second: the "
        "highest p99 of the requests that arrived in one second, and the seconds whose p99 passed 500 ms. "
        "Open broker us: the broker's CPU a task the open loop completed; open group: the tasks an API group "
        "commit carried in it; open / closed: the all-in CPU a task (API, batcher, broker, Redis) of the open "
        "loop over the closed loop's. CPU: us a completed task in the closed loop, summed over the role's processes."
        + (f" The requests topic rotated every {results['rotation_s']:g} s." if results.get("rotation_s") else "")
        + (
            f" Each API process began a group commit at most every {results['group_gap_ms']:g} ms."
            if results.get("group_gap_ms")
            else ""
        )
        + (
            f" An API process had at most {results['unacknowledged']} group commits out at the broker unanswered"
            " (0: no bound)."
            if results.get("unacknowledged", 1) != 1
            else ""
        )
        + (f" Settings set: {', '.join(results['settings'])}." if results.get("settings") else "")
        + (
            f" The API's task routes took the {results['lane']} lane (api_direct_lane)."
            if results.get("lane", "direct") != "direct"
            else ""
        ),
        "",
        "| broker | config | rows/s | x first | per added | rows a call | open offered | open answered | open p50 ms "
        "| open p99 ms | worst second p99 ms | seconds over 500 ms | open broker us | open group | open / closed | "
        + " | ".join(f"{role} us" for role in ROLES)
        + " |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(ROLES),
    ]
    for run in runs:
        base = firsts[broker_of(run)]
        ratio = run["rows_per_s"] / base["rows_per_s"] if base["rows_per_s"] else 0.0
        first, this = Shape.parse(base["config"]), Shape.parse(run["config"])
        added = (this.api_workers - first.api_workers) + (this.batchers - first.batchers)
        per_added = f"{(ratio - 1) / added:.2f}" if added > 0 else "-"
        cpu = run["cpu_us_per_task"]
        lines.append(
            f"| {broker_of(run)} | {run['config']} | {run['rows_per_s']:.0f} | {ratio:.2f} | {per_added} "
            f"| {run.get('rows_per_call', 0.0):.1f} | {run['open_offered']:.0f} "
            f"| {run['open_rows_per_s']:.0f} | {run['open_p50_ms']:.1f} "
            f"| {run['open_p99_ms']:.1f} | {worst_of(run)} | {over_of(run, SLOW_SECOND_MS)} "
            f"| {open_figure(run, 'open_broker_us', 0)} "
            f"| {open_figure(run, 'open_group_mean', 1)} | {open_over_closed(run)} | "
            + " | ".join(f"{cpu.get(role, 0.0):.0f}" for role in ROLES)
            + " |"
        )
    lines += broker_comparison(runs)
    lines += errors_footer(results["runs"], lambda run: f"{broker_of(run)} {run['config']}")
    return "\n".join(lines) + "\n"


# The all-in CPU a task the open-loop targets count: Brimful's processes and its servers.
ALL_IN = ("api", "batcher", "broker", "redis")


def open_over_closed(run: dict[str, Any]) -> str:
    """The open loop's all-in CPU a task over the closed loop's ("-" for runs saved before
    the open loop's CPU was read by role)."""
    opened = run.get("open_cpu_us_per_task")
    closed = sum(run["cpu_us_per_task"].get(role, 0.0) for role in ALL_IN)
    if not opened or not closed:
        return "-"
    return f"{sum(opened.get(role, 0.0) for role in ALL_IN) / closed:.2f}x"


def broker_comparison(runs: list[dict[str, Any]]) -> list[str]:
    """Kafka's figures over Tansu's, for each configuration measured on both in the run."""
    on = {(broker_of(run), run["config"]): run for run in runs}
    pairs = [(on[("tansu", c)], on[("kafka", c)]) for b, c in on if b == "kafka" and ("tansu", c) in on]
    if not pairs:
        return []
    lines = [
        "",
        f"Apache Kafka against Tansu, each figure Kafka's over Tansu's ({broker_label('kafka')} against "
        f"{broker_label('tansu')}; below 1 is less on Kafka):",
        "",
        "| config | rows/s | closed p99 | open p99 | worst second p99 | broker us (closed) | open broker us "
        "| all processes us |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for tansu, kafka in pairs:
        worst = [worst_second(run.get("open_by_second") or []).get("p99_ms", 0.0) for run in (tansu, kafka)]
        total = [sum(run["cpu_us_per_task"].values()) for run in (tansu, kafka)]
        lines.append(
            f"| {kafka['config']} | {over(kafka['rows_per_s'], tansu['rows_per_s'])} "
            f"| {over(kafka['closed_p99_ms'], tansu['closed_p99_ms'])} "
            f"| {over(kafka['open_p99_ms'], tansu['open_p99_ms'])} | {over(worst[1], worst[0])} "
            f"| {over(kafka['cpu_us_per_task']['broker'], tansu['cpu_us_per_task']['broker'])} "
            f"| {over(kafka.get('open_broker_us', 0.0), tansu.get('open_broker_us', 0.0))} "
            f"| {over(total[1], total[0])} |"
        )
    return lines


def over(value: float, base: float) -> str:
    return f"{value / base:.2f}" if base else "-"


def worst_of(run: dict[str, Any]) -> str:
    """The open loop's worst second's p99, or - where the run has no timeline."""
    worst = worst_second(run.get("open_by_second") or [])
    return f"{worst['p99_ms']:.0f}" if worst else "-"


def over_of(run: dict[str, Any], p99_ms: float) -> str:
    """'k of n': the open loop's seconds with a p99 above ``p99_ms``, or - without a timeline."""
    timeline = run.get("open_by_second") or []
    return f"{seconds_over(timeline, p99_ms)} of {len(timeline)}" if timeline else "-"


def open_figure(run: dict[str, Any], name: str, decimals: int) -> str:
    """An open-loop figure of a run, or - where the run predates it."""
    return f"{run[name]:.{decimals}f}" if name in run else "-"


def open_loop_rate(results: dict[str, Any]) -> str:
    """How the report's open loop was offered."""
    rate = results.get("open_rate", 0.0)
    return f"{rate:g} rows/s" if rate else f"{OPEN_LOOP_SHARE:.0%} of the closed loop's rate"


def setting_pair(parser: argparse.ArgumentParser, text: str) -> tuple[str, str]:
    """``NAME=VALUE`` of ``--set`` as a pair, the name one of the settings (else a usage error)."""
    name, sign, value = text.partition("=")
    if not sign or name not in Settings.model_fields:
        parser.error(f"--set takes NAME=VALUE with NAME a setting of core/settings.py, not {text!r}")
    return name, value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="comma-separated WxBxPxE configurations")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each loop")
    parser.add_argument("--clients", type=int, default=CLIENTS, help="closed-loop clients")
    parser.add_argument("--load-processes", type=int, default=1, help="processes sending the load")
    parser.add_argument("--open-rate", type=float, default=0.0, help="open-loop rows/s (0: 80%% of the closed loop)")
    parser.add_argument("--rotation-s", type=float, default=0.0, help="requests topic rotation period (0: one topic)")
    parser.add_argument("--group-gap-ms", type=float, default=0.0, help="the API's submit_group_gap_ms")
    parser.add_argument(
        "--unacknowledged", type=int, default=1, help="the API's submit_groups_unacknowledged (0: no bound)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting by its name in core/settings.py, for every stack (repeatable)",
    )
    parser.add_argument("--lane", choices=list(LANES), default="direct", help="the API's lane for the task routes")
    parser.add_argument(
        "--model-host-python",
        default=sys.executable,
        help="the model hosts' interpreter, where this one cannot host PyTriton (numpy 2)",
    )
    parser.add_argument(
        "--brokers", default="tansu", help="comma-separated, of tansu and kafka: each configuration runs on each"
    )
    add_report_arguments(parser, "scale")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "scale", render)
    if args.render:
        report.render_again()
        return 0
    shapes = [Shape.parse(part) for part in args.configs.split(",")]
    brokers = [part.strip() for part in args.brokers.split(",")]
    if unknown := [broker for broker in brokers if broker not in BROKERS]:
        parser.error(f"--brokers takes {' and '.join(BROKERS)}, not {', '.join(unknown)}")
    defaults = {"configs": DEFAULT_CONFIGS, "seconds": 10.0, "clients": CLIENTS, "load_processes": 1, "open_rate": 0.0}
    defaults["model_host_python"] = sys.executable
    defaults["rotation_s"] = 0.0
    defaults["group_gap_ms"] = 0.0
    defaults["lane"] = "direct"
    defaults["unacknowledged"] = 1
    defaults["brokers"] = "tansu"
    command = command_line("bench.scale", args, defaults) + "".join(f" --set {text}" for text in args.set)
    options = RunOptions(
        args.clients,
        args.load_processes,
        args.open_rate,
        args.model_host_python,
        args.rotation_s,
        args.group_gap_ms,
        args.lane,
        unacknowledged=args.unacknowledged,
        settings=tuple(setting_pair(parser, text) for text in args.set),
    )
    results: dict[str, Any] = {
        "command": command,
        "machine": machine_description(),
        "seconds": args.seconds,
        "clients": options.clients,
        "load_processes": options.processes,
        "open_rate": options.open_rate,
        "rotation_s": options.rotation_s,
        "group_gap_ms": options.group_gap_ms,
        "lane": options.lane,
        "unacknowledged": options.unacknowledged,
        "settings": [f"{name}={value}" for name, value in options.settings],
        "runs": [],
    }
    for shape in shapes:
        for broker in brokers:
            print(f"{shape} on {broker}:", flush=True)
            try:
                run = measure(shape, args.seconds, dataclasses.replace(options, broker=broker))
            except Exception as error:  # recorded; the next configuration still runs
                run = {"config": str(shape), "broker": broker, "error": why(error)}
            results["runs"].append(run)
            report.save(results)
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
