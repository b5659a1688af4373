"""``brimful simulate``: replay arrival traces through the flush policy on a virtual clock.

brimful simulate --generate poisson --rate 200 --duration 60 --out poisson.parquet
brimful simulate --trace poisson.parquet                     # the current settings
brimful simulate --trace poisson.parquet --set max_wait_ms=100
brimful simulate --trace traces/ --sweep max_wait_ms=20:300:15 --plot sweep.png
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from brimful.batcher import traces
from brimful.batcher.simulator import PoolModel, SimulationResult, simulate
from brimful.commands.api_client import CommandError
from brimful.core.policy_params import TUNABLE
from brimful.core.policy_tuning import TuningError, apply_changes, defaults_from_settings, params_from_values
from brimful.core.settings import get_settings

_COLUMNS = ("mean_rows_per_batch", "padded_share", "p50_ms", "p99_ms", "p99_wait_ms", "batches_per_s")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("simulate", help="replay or generate arrival traces for the flush policy")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, help="a Parquet trace, or a directory of them (recorded by batchers)")
    source.add_argument("--generate", choices=("poisson", "bursty", "ramp"), help="write a synthetic trace to --out")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"policy parameter for the replay ({', '.join(TUNABLE)})",
    )
    parser.add_argument("--sweep", metavar="NAME=FROM:TO:N", help="replay N settings of one parameter and compare")
    parser.add_argument("--plot", type=Path, default=Path("sweep.png"), help="PNG written by --sweep")
    pool = parser.add_argument_group("the model pool replayed against")
    pool.add_argument("--endpoints", type=int, default=1, help="model endpoints (default 1)")
    pool.add_argument("--slots", type=int, default=2, help="concurrent calls per endpoint (default 2)")
    pool.add_argument(
        "--call-ms",
        "--service-ms",
        dest="call_ms",
        type=float,
        default=5.0,
        help="time of a call whatever its rows (default 5)",
    )
    pool.add_argument("--per-row-ms", type=float, default=0.0, help="and for each real row (default 0)")
    pool.add_argument("--jitter", type=float, default=0.0, help="each call's time x uniform(1-j, 1+j)")
    pool.add_argument(
        "--around-ms",
        type=float,
        default=0.0,
        help="what a task spends outside its batch and call, counted against the latency target "
        "(a live batcher's /status shows it as pool.around_call_s; default 0)",
    )
    generate = parser.add_argument_group("generating (--generate)")
    generate.add_argument("--out", type=Path, help="where to write the generated trace")
    generate.add_argument("--duration", type=float, default=60.0, help="seconds of traffic (default 60)")
    generate.add_argument("--partitions", type=int, default=1)
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--rate", type=float, default=200.0, help="poisson: requests per second")
    generate.add_argument("--rate-on", type=float, default=2000.0, help="bursty: rate during a burst")
    generate.add_argument("--rate-off", type=float, default=20.0, help="bursty: rate between bursts")
    generate.add_argument("--period", type=float, default=10.0, help="bursty: seconds per on/off cycle")
    generate.add_argument("--duty", type=float, default=0.2, help="bursty: share of the cycle that bursts")
    generate.add_argument("--rate-from", type=float, default=10.0, help="ramp: starting rate")
    generate.add_argument("--rate-to", type=float, default=2000.0, help="ramp: final rate")
    parser.set_defaults(handler=run)


def generate_trace(args: argparse.Namespace) -> traces.Trace:
    if args.generate == "poisson":
        return traces.poisson(args.rate, args.duration, args.partitions, args.seed)
    if args.generate == "bursty":
        return traces.bursty(
            args.rate_on, args.rate_off, args.period, args.duty, args.duration, args.partitions, args.seed
        )
    return traces.ramp(args.rate_from, args.rate_to, args.duration, args.partitions, args.seed)


def parse_sweep(text: str) -> tuple[str, list[float]]:
    name, sep, spec = text.partition("=")
    parts = spec.split(":")
    if not sep or len(parts) != 3:
        raise CommandError(f"--sweep wants NAME=FROM:TO:N, got {text!r}")
    try:
        low, high, count = float(parts[0]), float(parts[1]), int(parts[2])
    except ValueError as error:
        raise CommandError(f"--sweep wants numbers in FROM:TO:N, got {spec!r}") from error
    if count < 2:
        raise CommandError("--sweep needs N of at least 2")
    return name, [low + (high - low) * i / (count - 1) for i in range(count)]


def format_row(label: str, result: SimulationResult) -> str:
    summary = result.summary()
    return f"{label:>16} " + " ".join(f"{summary[c]:>12g}" for c in _COLUMNS)


def header() -> str:
    return f"{'setting':>16} " + " ".join(f"{c.replace('_', ' ')[:12]:>12}" for c in _COLUMNS)


def plot_sweep(points: list[tuple[float, SimulationResult]], name: str, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise CommandError("--sweep plots need matplotlib: pip install 'brimful[plot]'") from error
    figure, axes = plt.subplots(figsize=(7, 4.5))
    waits = [r.latency_quantile(0.99) * 1000 for _, r in points]
    fills = [r.mean_rows_per_batch for _, r in points]
    axes.plot(waits, fills, marker="o")
    for (value, _), x, y in zip(points, waits, fills):
        axes.annotate(f"{value:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    axes.set_xlabel("p99 arrival to result (ms)")
    axes.set_ylabel(f"mean real rows per batch (of {points[0][1].batch_size})")
    axes.set_title(f"fill versus p99 wait, sweeping {name}")
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (CommandError, TuningError, FileNotFoundError) as error:
        print(f"brimful simulate: {error}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.generate:
        if args.out is None:
            raise CommandError("--generate needs --out FILE")
        trace = generate_trace(args)
        traces.write_trace(trace, args.out)
        print(f"wrote {sum(len(t) for t in trace.values())} arrivals over {args.duration:g} s to {args.out}")
        return 0

    settings = get_settings()
    overrides = {}
    for item in args.overrides:
        name, sep, value = item.partition("=")
        if not sep:
            raise CommandError(f"--set wants NAME=VALUE, got {item!r}")
        overrides[name] = value
    values = defaults_from_settings(settings)
    if overrides:
        values = apply_changes(values, overrides, settings.batch_size)
    trace = traces.read_trace(args.trace)
    for name, value in (("--endpoints", args.endpoints), ("--slots", args.slots)):
        if value < 1:
            raise CommandError(f"{name} must be at least 1")
    times = (args.call_ms, args.per_row_ms, args.around_ms)
    if not all(math.isfinite(t) and t >= 0 for t in times) or not 0 <= args.jitter < 1:
        raise CommandError(
            "--call-ms, --per-row-ms and --around-ms must be finite and not negative, --jitter must be in [0, 1)"
        )
    pool = PoolModel(
        args.endpoints,
        args.slots,
        args.call_ms / 1000,
        args.per_row_ms / 1000,
        args.jitter,
        around_s=args.around_ms / 1000,
    )

    def replay(candidate: dict[str, float], aware: bool = True) -> SimulationResult:
        return simulate(trace, params_from_values(candidate, settings.batch_size), pool, aware)

    print(
        f"trace: {sum(len(t) for t in trace.values())} arrivals on {len(trace)} partition(s); "
        f"pool: {pool.endpoints} endpoint(s) x {pool.slots_per_endpoint} slot(s), "
        f"{args.call_ms:g} ms + {args.per_row_ms:g} ms/row a call, {args.around_ms:g} ms around it"
    )
    print(header())
    print(format_row("pool-aware", replay(values)))
    print(format_row("EWMA timer", replay(values, aware=False)))
    if not args.sweep:
        return 0
    name, grid = parse_sweep(args.sweep)
    points = []
    for value in grid:
        result = replay(apply_changes(values, {name: value}, settings.batch_size))
        points.append((value, result))
        print(format_row(f"{name}={value:g}", result))
    plot_sweep(points, name, args.plot)
    print(f"plot: {args.plot}")
    return 0
