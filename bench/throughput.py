"""Throughput and latency: Brimful against the ceiling, naive calls and Triton's own batcher.

    .venv/bin/python bench/throughput.py [--out-dir bench/results] [--models reference,gpu-like] [--quick]

For each model it starts the embedded stack (with the model also served behind Triton's
dynamic batcher), and runs ``bench/loadgen.py`` in a process of its own against each path:

1. ceiling: 64 real rows per call straight to Triton, two calls in flight (closed loop);
2. naive: one row per call padded to 64, straight to Triton, 256 clients (closed loop);
3. Triton's dynamic batcher: one row per call, 256 clients (closed loop);
4. Brimful end to end, 256 clients (closed loop): its saturation throughput, with the CPU
   time and peak RSS of every process read from /proc;
5. a sweep of open-loop Poisson load at 5-100% of Brimful's saturation through Brimful and
   through Triton's dynamic batcher: throughput, p50/p99, rows per batch;
6. a pyinstrument profile of the Brimful process that spent the most CPU, at saturation.

Models: ``reference`` (hashing, cheap: shows Brimful's own overhead) and ``gpu-like`` (the
reference model with every call taking at least 20 ms whatever its real rows: a stand-in
for a memory-bound GPU model, where batching pays). Writes ``throughput.md``, a PNG per
model and the profile to the output directory.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.process_usage import Usage, group_members, usage  # noqa: E402
from brimful.redis_keys import RedisKeys  # noqa: E402
from brimful.stack import EmbeddedStack, ManagedProcess, settings_env, settings_on_free_ports, wait_until  # noqa: E402
from brimful.stack.processes import http_ok  # noqa: E402
from workers.model_host import DYNAMIC_MODEL_NAME  # noqa: E402

LOADGEN = Path(__file__).resolve().parent / "loadgen.py"
CLIENTS = 256
SWEEP = (0.05, 0.25, 0.5, 0.8, 1.0)
GPU_LIKE_CALL_MS = 20
MODELS: dict[str, tuple[str, ...]] = {
    "reference": (),
    "gpu-like": ("--call-ms", str(GPU_LIKE_CALL_MS)),
}
BRIMFUL_PROCESSES = ("api", "batcher-0")
OTHER_PROCESSES = ("broker", "redis", "triton")


@dataclass
class ModelRun:
    """Everything measured for one model."""

    name: str
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)   # closed-loop runs by path
    sweep: list[dict[str, Any]] = field(default_factory=list)       # one entry per offered load
    cpu_us_per_request: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    profile: str = ""
    profiled: str = ""
    top_costs: list[tuple[str, float]] = field(default_factory=list)
    idle_share: float = 0.0

    @property
    def saturation(self) -> float:
        return float(self.runs["brimful"]["achieved_rows_per_s"])


def loadgen(stack: EmbeddedStack, path: str, seconds: float, *, rate: float = 0, clients: int = 0) -> dict[str, Any]:
    """Run the load generator in its own process and return its summary."""
    model = DYNAMIC_MODEL_NAME if path == "dynamic" else stack.settings.model_name
    argv = [sys.executable, str(LOADGEN), "--path", path, "--url", stack.api_url, "--triton", stack.settings.triton_url,
            "--model", model, "--duration", str(seconds)]
    argv += ["--rate", str(rate)] if rate else ["--concurrency", str(clients)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 90)
    if done.returncode != 0:
        raise RuntimeError(f"loadgen {path} failed: {done.stderr[-2000:]}")
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"  {path:8} {'rate ' + format(rate, '.0f') if rate else 'clients ' + str(clients):>13}: "
          f"{summary['achieved_rows_per_s']:8.1f} rows/s  p50 {summary['p50_ms']:7.1f} ms  p99 {summary['p99_ms']:7.1f} ms"
          f"  errors {summary['errors']} lost {summary['lost']}", flush=True)
    return summary


def stats(stack: EmbeddedStack) -> dict[str, int]:
    with redis.Redis.from_url(stack.settings.redis_url) as client:
        raw = client.hgetall(RedisKeys(stack.settings.key_prefix).stats)
    return {k.decode(): int(v) for k, v in raw.items()}


def triton_batches(stack: EmbeddedStack, model: str) -> tuple[float, float]:
    """(rows, executions) Triton has counted for ``model`` so far, from its metrics endpoint."""
    url = f"http://127.0.0.1:{stack.triton_metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    def counter(name: str) -> float:
        match = re.search(rf'^{name}\{{[^}}]*model="{model}"[^}}]*\}} (\S+)$', text, re.M)
        return float(match.group(1)) if match else 0.0
    return counter("nv_inference_count"), counter("nv_inference_exec_count")


def process_pids(stack: EmbeddedStack, name: str) -> list[int]:
    process = stack.processes[name]
    assert process.pid is not None
    return group_members(process.pid)  # each managed process leads its own group


def measure_saturation(stack: EmbeddedStack, run: ModelRun, seconds: float) -> None:
    """Brimful at saturation, with the CPU each process spent per completed task."""
    names = [*BRIMFUL_PROCESSES, *OTHER_PROCESSES]
    before = {name: usage(process_pids(stack, name)) for name in names}
    done_before = stats(stack).get("tasks_done", 0)
    run.runs["brimful"] = loadgen(stack, "brimful", seconds, clients=CLIENTS)
    after = {name: usage(process_pids(stack, name)) for name in names}
    tasks = max(1, stats(stack).get("tasks_done", 0) - done_before)
    for name in names:
        run.cpu_us_per_request[name] = (after[name].cpu_s - before[name].cpu_s) / tasks * 1e6
        run.peak_rss_mb[name] = after[name].peak_rss_mb
    print("  CPU us per request: " + ", ".join(f"{n} {v:.0f}" for n, v in run.cpu_us_per_request.items()), flush=True)


def measure_sweep(stack: EmbeddedStack, run: ModelRun, seconds: float) -> None:
    for fraction in SWEEP:
        rate = max(1.0, fraction * run.saturation)
        before = stats(stack)
        brimful = loadgen(stack, "brimful", seconds, rate=rate)
        after = stats(stack)
        batches = after.get("batches_dispatched", 0) - before.get("batches_dispatched", 0)
        rows = after.get("rows_dispatched", 0) - before.get("rows_dispatched", 0)
        rows_before, calls_before = triton_batches(stack, DYNAMIC_MODEL_NAME)
        dynamic = loadgen(stack, "dynamic", seconds, rate=rate)
        rows_after, calls_after = triton_batches(stack, DYNAMIC_MODEL_NAME)
        run.sweep.append({
            "fraction": fraction,
            "offered": rate,
            "brimful": brimful,
            "brimful_rows_per_batch": rows / batches if batches else 0.0,
            "dynamic": dynamic,
            "dynamic_rows_per_batch": (rows_after - rows_before) / max(1.0, calls_after - calls_before),
        })


def profile_hottest(stack: EmbeddedStack, run: ModelRun, workdir: Path, seconds: float) -> None:
    """Restart the hottest Brimful process under pyinstrument and profile it at saturation."""
    name = max(BRIMFUL_PROCESSES, key=lambda n: run.cpu_us_per_request[n])
    module = "api" if name == "api" else "batcher"
    stack.processes.pop(name).stop()
    session_path = workdir / f"profile-{name}.pyisession"
    profiled = ManagedProcess(
        name=name,
        argv=[sys.executable, "-m", "pyinstrument", "-r", "pyisession", "-o", str(session_path), "-m", module],
        env=settings_env(stack.settings),
        log_path=workdir / f"profiled-{name}.log",
        stop_timeout_s=120.0,  # a clean exit, then pyinstrument writes its session: never cut it short
    )
    profiled.start()
    stack.processes[name] = profiled
    if name == "api":
        wait_until(lambda: http_ok(f"{stack.api_url}/readyz"), 60, "profiled api", profiled)
    else:
        stack.wait_for_batchers()
    loadgen(stack, "brimful", seconds, clients=CLIENTS)
    # SIGINT, not SIGTERM: uvicorn re-raises the signal it stopped on, and only a
    # KeyboardInterrupt lets pyinstrument write its session on the way out.
    profiled.stop(signal.SIGINT)
    stack.processes.pop(name)
    if not session_path.exists():
        run.profile = f"(no profile written; see {profiled.log_path})"
        return
    from pyinstrument.renderers import ConsoleRenderer
    from pyinstrument.session import Session

    session = Session.load(str(session_path))
    run.profiled = name
    run.profile = ConsoleRenderer(unicode=False, color=False, show_all=False, short_mode=True).render(session)
    run.top_costs, run.idle_share = top_self_time(session)


IDLE_FILES = ("asyncio/runners.py", "asyncio/base_events.py", "selectors.py")


def top_self_time(session: Any, count: int = 15) -> tuple[list[tuple[str, float]], float]:
    """Functions by their share of the process's busy samples (time in the function itself,
    not in what it calls), and the share of all samples spent idle in the event loop."""
    totals: dict[str, float] = {}
    idle = 0.0
    frames = [session.root_frame()]
    while frames:
        frame = frames.pop()
        if (frame.file_path_short or "").startswith("<frozen importlib"):
            continue  # start-up imports: not the steady state being profiled
        frames.extend(frame.children)
        if frame.total_self_time <= 0:
            continue
        owner = frame.parent if frame.is_synthetic_leaf and frame.parent is not None else frame
        path = owner.file_path_short or ""
        if any(path.endswith(idle_file) for idle_file in IDLE_FILES):
            idle += frame.total_self_time
            continue
        where = f"{owner.function} ({path}:{owner.line_no})" if path else owner.function
        totals[where] = totals.get(where, 0.0) + frame.total_self_time
    busy = sum(totals.values()) or 1.0
    ranked = sorted(((k, v / busy) for k, v in totals.items()), key=lambda item: -item[1])[:count]
    return ranked, idle / (busy + idle)


def measure_model(name: str, workdir: Path, quick: bool) -> ModelRun:
    seconds = 6.0 if quick else 10.0
    settings = settings_on_free_ports(
        rate_limit_per_s=0, tenant_max_in_flight=0, max_backlog=10_000_000, result_ttl_s=600
    )
    stack = EmbeddedStack(settings, workdir / name, model_host_args=(*MODELS[name], "--with-dynamic"))
    print(f"{name}: starting the stack", flush=True)
    stack.start()
    run = ModelRun(name)
    try:
        run.runs["ceiling"] = loadgen(stack, "full", seconds, clients=2)
        run.runs["naive"] = loadgen(stack, "padded", seconds, clients=CLIENTS)
        run.runs["dynamic"] = loadgen(stack, "dynamic", seconds, clients=CLIENTS)
        measure_saturation(stack, run, seconds)
        measure_sweep(stack, run, seconds)
        profile_hottest(stack, run, workdir, seconds)
    finally:
        stack.stop()
    return run


def plot(run: ModelRun, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    offered = [point["offered"] for point in run.sweep]
    figure, (through, latency, fill) = plt.subplots(1, 3, figsize=(15, 4.2))
    through.plot(offered, [p["brimful"]["achieved_rows_per_s"] for p in run.sweep], "o-", label="Brimful")
    through.plot(offered, [p["dynamic"]["achieved_rows_per_s"] for p in run.sweep], "s--", label="Triton dynamic batcher")
    through.axhline(run.runs["ceiling"]["achieved_rows_per_s"], color="grey", linestyle=":", label="ceiling (full batches)")
    through.axhline(run.runs["naive"]["achieved_rows_per_s"], color="red", linestyle=":", label="naive (padded singles)")
    through.set(xlabel="offered load (requests/s)", ylabel="achieved (rows/s)", title="throughput")
    through.legend(fontsize=8)
    for key, style, label in (("brimful", "-", "Brimful"), ("dynamic", "--", "Triton dynamic")):
        latency.plot(offered, [p[key]["p50_ms"] for p in run.sweep], "o" + style, label=f"{label} p50")
        latency.plot(offered, [p[key]["p99_ms"] for p in run.sweep], "^" + style, label=f"{label} p99")
    latency.set(xlabel="offered load (requests/s)", ylabel="submit to result (ms)", title="latency", yscale="log")
    latency.legend(fontsize=8)
    fill.plot(offered, [p["brimful_rows_per_batch"] for p in run.sweep], "o-", label="Brimful")
    fill.plot(offered, [p["dynamic_rows_per_batch"] for p in run.sweep], "s--", label="Triton dynamic")
    fill.set(xlabel="offered load (requests/s)", ylabel="real rows per model call", title="batch fill", ylim=(0, 66))
    fill.legend(fontsize=8)
    figure.suptitle(f"{run.name} model")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def verdict(value: float, target: float, higher_is_better: bool = True) -> str:
    met = value >= target if higher_is_better else value <= target
    return "met" if met else f"missed by {abs(value - target) / target:.0%}"


def report(runs: list[ModelRun], command: str, elapsed_s: float, min_wait_ms: float) -> str:
    lines = [
        "# Throughput benchmark: Brimful against the ceiling, naive calls and Triton's dynamic batcher",
        "",
        f"Command: `{command}` ({elapsed_s / 60:.1f} min). Machine: {platform.machine()}, "
        f"{_cpu_count()} CPU cores, Python {platform.python_version()}. Every process (load generator, API, "
        "batcher, broker, Redis, Triton) shares those cores, as on the CI machine: figures are for this machine only.",
        "",
    ]
    for run in runs:
        ceiling, naive, dynamic = (run.runs[k]["achieved_rows_per_s"] for k in ("ceiling", "naive", "dynamic"))
        saturation = run.saturation
        by_fraction = {p["fraction"]: p for p in run.sweep}
        brimful_cpu = sum(run.cpu_us_per_request[n] for n in BRIMFUL_PROCESSES)
        lines += [
            f"## {run.name} model" + (f" (every call at least {GPU_LIKE_CALL_MS} ms: a memory-bound GPU stand-in)" if run.name == "gpu-like" else ""),
            "",
            f"![{run.name}](throughput_{run.name}.png)",
            "",
            "| Path | rows/s at saturation | p50 ms | p99 ms | Brimful / this |",
            "|---|---|---|---|---|",
        ]
        for key, label in (("ceiling", "ceiling: full 64-row batches straight to Triton"),
                           ("naive", f"naive: single rows padded to 64, {CLIENTS} clients"),
                           ("dynamic", f"Triton dynamic batcher, single rows, {CLIENTS} clients"),
                           ("brimful", f"Brimful end to end, {CLIENTS} clients")):
            r = run.runs[key]
            ratio = saturation / r["achieved_rows_per_s"] if r["achieved_rows_per_s"] else float("nan")
            lines.append(f"| {label} | {r['achieved_rows_per_s']:.0f} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {ratio:.2f}x |")
        lines += [
            "",
            "Open-loop Poisson sweep (offered load as a share of Brimful's saturation):",
            "",
            "| offered /s | share | Brimful rows/s | p50 ms | p99 ms | rows per batch | dynamic rows/s | dynamic p50 ms | dynamic p99 ms | dynamic rows per call |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for p in run.sweep:
            b, d = p["brimful"], p["dynamic"]
            lines.append(
                f"| {p['offered']:.0f} | {p['fraction']:.0%} | {b['achieved_rows_per_s']:.0f} | {b['p50_ms']:.0f} | {b['p99_ms']:.0f} "
                f"| {p['brimful_rows_per_batch']:.1f} | {d['achieved_rows_per_s']:.0f} | {d['p50_ms']:.0f} | {d['p99_ms']:.0f} "
                f"| {p['dynamic_rows_per_batch']:.1f} |"
            )
        errors = sum(p[k]["errors"] + p[k]["lost"] for p in run.sweep for k in ("brimful", "dynamic"))
        lines += [
            "",
            f"Errors or lost requests across the sweep: {errors}.",
            "",
            "CPU per completed request at saturation, and peak RSS, by process (from /proc):",
            "",
            "| process | CPU us per request | peak RSS MB |",
            "|---|---|---|",
        ]
        for name in (*BRIMFUL_PROCESSES, *OTHER_PROCESSES):
            lines.append(f"| {name} | {run.cpu_us_per_request[name]:.0f} | {run.peak_rss_mb[name]:.0f} |")
        lines += [f"| **Brimful (api + batcher)** | **{brimful_cpu:.0f}** | |", ""]
        if run.name == "gpu-like":
            p99_80 = by_fraction[0.8]["brimful"]["p99_ms"]
            p50_5 = by_fraction[0.05]["brimful"]["p50_ms"]
            lines += [
                "Targets:",
                "",
                f"- Brimful / ceiling = {saturation / ceiling:.2f} (target 0.9: {verdict(saturation / ceiling, 0.9)})",
                f"- Brimful / naive = {saturation / naive:.1f}x (target 20x: {verdict(saturation / naive, 20)})",
                f"- Brimful / Triton dynamic batcher = {saturation / dynamic:.2f}",
                f"- p99 at 80% of saturation = {p99_80:.0f} ms (target 500: {verdict(p99_80, 500, False)})",
                f"- p50 at 5% of saturation = {p50_5:.0f} ms (target min_wait + 20 = {min_wait_ms + 20:.0f}: "
                f"{verdict(p50_5, min_wait_ms + 20, False)})",
                "",
            ]
        else:
            lines += [f"Target: Brimful CPU per request <= 300 us: {brimful_cpu:.0f} us ({verdict(brimful_cpu, 300, False)}).", ""]
        if run.top_costs:
            lines += [
                f"Profile of `{run.profiled}` at saturation (pyinstrument). It sat idle in the event loop for "
                f"{run.idle_share:.0%} of the samples; of the busy rest, the share spent in each function itself "
                "(not in what it calls):",
                "",
                "| function | share |",
                "|---|---|",
                *(f"| `{where}` | {share:.1%} |" for where, share in run.top_costs),
                "",
                f"The call tree is in [profile_{run.name}.txt](profile_{run.name}.txt).",
                "",
            ]
    return "\n".join(lines)


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of: {', '.join(MODELS)}")
    parser.add_argument("--quick", action="store_true", help="6 s per run instead of 10 (a smoke run)")
    args = parser.parse_args()
    started = time.monotonic()
    runs: list[ModelRun] = []
    with tempfile.TemporaryDirectory(prefix="brimful-bench-") as scratch:
        for name in args.models.split(","):
            runs.append(measure_model(name.strip(), Path(scratch), args.quick))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for run in runs:
        plot(run, args.out_dir / f"throughput_{run.name}.png")
        if run.profile:
            (args.out_dir / f"profile_{run.name}.txt").write_text(run.profile)
    command = "python bench/throughput.py" + (" --quick" if args.quick else "") + (
        f" --models {args.models}" if args.models != ",".join(MODELS) else "")
    min_wait_ms = settings_on_free_ports().min_wait_ms
    text = report(runs, command, time.monotonic() - started, min_wait_ms)
    (args.out_dir / "throughput.md").write_text(text)
    (args.out_dir / "throughput.json").write_text(json.dumps([run.__dict__ for run in runs], indent=1, default=str))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
