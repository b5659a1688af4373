"""The throughput benchmark's report: markdown and plots from the figures of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.harness.profile_summary import PACKAGE_GROUPS
from bench.harness.throughput_plan import (
    BRIMFUL_PROCESSES,
    CLIENTS,
    GPU_LIKE_CALL_MS,
    LATENCY_TUNED_ROWS,
    OTHER_PROCESSES,
    RAY_SWEEP,
    Machine,
    ModelRun,
)

FLOOR_ROWS = (
    ("asgi/raw", "uvicorn, a bare ASGI app"),
    ("asgi/aiohttp", "uvicorn, a bare ASGI app, driven by aiohttp instead"),
    ("fastapi/raw", "uvicorn, a FastAPI route"),
)
# CPU per accepted request at saturation
API_TARGET_US, BATCHER_TARGET_US, BRIMFUL_TARGET_US = 150, 40, 200


def plot(run: ModelRun, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    offered = [point["offered"] for point in run.sweep]
    figure, (through, latency, fill) = plt.subplots(1, 3, figsize=(15, 4.2))
    through.plot(offered, [p["brimful"]["achieved_rows_per_s"] for p in run.sweep], "o-", label="Brimful")
    through.plot(
        offered, [p["dynamic"]["achieved_rows_per_s"] for p in run.sweep], "s--", label="Triton dynamic batcher"
    )
    through.axhline(
        run.runs["ceiling"]["achieved_rows_per_s"], color="grey", linestyle=":", label="ceiling (full batches)"
    )
    through.axhline(
        run.runs["naive"]["achieved_rows_per_s"], color="red", linestyle=":", label="naive (padded singles)"
    )
    through.set(xlabel="offered load (requests/s)", ylabel="achieved (rows/s)", title="throughput")
    through.legend(fontsize=8)
    for key, color, label in (("brimful", "C0", "Brimful"), ("dynamic", "C1", "Triton dynamic")):
        latency.plot(offered, [p[key]["p50_ms"] for p in run.sweep], "o-", color=color, label=f"{label} p50")
        latency.plot(offered, [p[key]["p99_ms"] for p in run.sweep], "^--", color=color, label=f"{label} p99")
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


def summary(runs: list[ModelRun], machine: Machine, min_wait_ms: float, worthwhile_rows: float) -> list[str]:
    """The headline figures and what stands in the way of the missed targets."""
    lines = ["## Summary", ""]
    cores = "two" if machine.cores == 2 else str(machine.cores)
    for run in runs:
        ceiling, naive, dynamic = (run.runs[k]["achieved_rows_per_s"] for k in ("ceiling", "naive", "dynamic"))
        ray = f", **{run.saturation / run.ray['saturation']['achieved_rows_per_s']:.1f}x** Ray Serve" if run.ray else ""
        fills = [p["brimful_rows_per_batch"] for p in run.sweep if p["fraction"] >= 0.25]
        lines.append(
            f"- **{run.name}**: Brimful peaks at {run.saturation:.0f} rows/s = **{run.saturation / ceiling:.2f}x** the "
            f"ceiling, **{run.saturation / naive:.1f}x** naive padded calls, **{run.saturation / dynamic:.2f}x** "
            f"Triton's dynamic batcher{ray}. From 25% load up its batches carry {min(fills):.1f}-{max(fills):.1f} "
            "real rows of 64."
        )
    brimful_cpu = {run.name: sum(run.cpu_us_per_request[n] for n in BRIMFUL_PROCESSES) for run in runs}
    api = {run.name: run.cpu_us_per_request["api"] for run in runs}
    framework = {run.name: dict(run.packages).get(PACKAGE_GROUPS["fastapi"], 0.0) for run in runs}
    redis_share = {run.name: dict(run.packages).get("redis client", 0.0) for run in runs}
    name = "gpu-like" if "gpu-like" in api else runs[0].name
    focus = next(run for run in runs if run.name == name)
    own = dict(focus.packages).get("Brimful", 0.0)
    model_cpu = focus.cpu_us_per_request.get("triton", 0.0)
    if model_cpu > api[name]:
        lines += [
            "",
            f"Here the model itself is the largest consumer: {model_cpu:.0f} us of CPU per request in the Triton "
            f"process, on the same {cores} cores as Brimful's {brimful_cpu[name]:.0f} us (API and batcher) and the load "
            "generator. On a GPU that cost leaves the CPU; the paragraph below is about Brimful's own share.",
        ]
    lines += [
        "",
        f"What stands in the way of the ceiling and of {BRIMFUL_TARGET_US} us per request is one thing: the API, Python processes "
        f"({machine.api_workers} API workers here) that spend {api[name]:.0f} us of CPU per request ({brimful_cpu[name]:.0f} us with "
        "the batcher). It is the busiest process at saturation"
        + (
            f", and the profile of it shows where the time goes: {framework[name]:.0%} in the web framework "
            f"(uvicorn, Starlette, FastAPI routing and dependency resolution), {redis_share[name]:.0%} in the Redis "
            f"client, {own:.0%} in Brimful's own code. "
            if focus.packages
            else f" (its profile failed in this run: {focus.profile}). "
        )
        + f"On {cores} shared "
        f"cores, with the load generator taking its own share, that holds Brimful to {focus.sustained:.0f} requests a "
        f"second sustained, while the {name} model takes {focus.runs['ceiling']['achieved_rows_per_s']:.0f} rows a "
        "second in full batches. What the profiles showed is cut where it was cheap to cut: the two routes every "
        "task takes are answered inside the HTTP protocol, past ASGI and FastAPI (the direct lane), submissions that arrive "
        "together share one Redis script call and one producer send (group commit), a batch's results reach the "
        "API as one push carrying them all, the status board is read without scanning the keyspace, and the "
        "batcher runs on uvloop. The floor (next section) says how much of what is left is the HTTP server itself; the "
        "rest is Python doing Brimful's work a request at a time. More API workers or replicas scale it out "
        + (
            "on a machine with cores to spare, which this one does not have: near saturation every process here, the "
            "load generator included, competes for the same two cores, and latency at 80% load moves from run to run "
            "(see the Triton dynamic batcher's p99 beside Brimful's at the same load)."
            if machine.cores <= 2
            else "on a machine with cores to spare, as this one has."
        ),
        "",
        "Latency against Triton's dynamic batcher: Brimful's flush policy knows the model pool. With a slot "
        "free it sends what waits at once unless rows worth waiting for are expected within the latency target "
        f"(`latency_target_ms`, after `min_wait` = {min_wait_ms:g} ms); while the model is busy the batch fills. "
        "So at light load it behaves like the dynamic batcher plus Brimful's own hops (HTTP, Kafka, Redis), and "
        "under load it sends fuller batches. docs/batching.md states the policy.",
        "",
    ]
    return lines


def floor_section(floor: dict[str, Any], runs: list[ModelRun], workers: int) -> list[str]:
    """The HTTP server's own cost beside Brimful's API, and the load generator's cost."""
    lines = ["## The floor: the API's HTTP server alone", ""]
    if "failed" in floor or not floor:
        return [*lines, f"Not measured in this run: {floor.get('failed', {}).get('why', 'no figures saved')}", ""]
    lines += [
        f"The same server as the API ({workers} uvicorn workers, uvloop, httptools) answering the same POST with a "
        f"constant 202 and no I/O, {CLIENTS} clients, in the same run:",
        "",
        "| server | requests/s | server CPU us per request | load generator CPU us per request |",
        "|---|---|---|---|",
    ]
    for key, label in FLOOR_ROWS:
        if key in floor:
            f = floor[key]
            lines.append(
                f"| {label} | {f['achieved_rows_per_s']:.0f} | {f['server_cpu_us_per_request']:.0f} "
                f"| {f['loadgen_cpu_us_per_request']:.0f} |"
            )
    lines.append("")
    if "fastapi/raw" in floor and "asgi/raw" in floor:
        bare, framework = (
            floor["asgi/raw"]["server_cpu_us_per_request"],
            floor["fastapi/raw"]["server_cpu_us_per_request"],
        )
        for run in runs:
            api = run.cpu_us_per_request["api"]
            lines.append(
                f"- {run.name}: the API spends {api:.0f} us a request, {api - framework:.0f} us above the "
                f"FastAPI floor ({framework:.0f} us) and {api / bare:.1f}x the bare server ({bare:.0f} us)."
            )
        lines.append("")
    return lines


def cpu_targets(run: ModelRun) -> list[str]:
    api, batcher = run.cpu_us_per_request["api"], run.cpu_us_per_request["batcher-0"]
    return [
        f"- API CPU per request <= {API_TARGET_US} us: {api:.0f} us ({verdict(api, API_TARGET_US, False)})",
        f"- batcher CPU per request <= {BATCHER_TARGET_US} us: {batcher:.0f} us ({verdict(batcher, BATCHER_TARGET_US, False)})",
        f"- Brimful (API + batcher) <= {BRIMFUL_TARGET_US} us: {api + batcher:.0f} us "
        f"({verdict(api + batcher, BRIMFUL_TARGET_US, False)})",
    ]


def report(
    runs: list[ModelRun],
    floor: dict[str, Any],
    command: str,
    elapsed_s: float,
    machine: Machine,
    min_wait_ms: float,
    worthwhile_rows: float,
) -> str:
    lines = [
        "# Throughput benchmark: Brimful against the ceiling, naive calls and Triton's dynamic batcher",
        "",
        f"Command: `{command}` ({elapsed_s / 60:.1f} min). Machine: {machine.arch}, {machine.cores} CPU cores"
        + (f", GPU: {machine.gpu}" if machine.gpu else "")
        + f", Python {machine.python}. Every process (load generator, API, "
        f"batcher, broker, Redis, Triton) shares those cores{', as on the CI machine' if machine.cores <= 2 else ''}: "
        "figures are for this machine only, "
        "and the machine is shared with others: repeated runs moved Brimful's saturation by a third or more.",
        "",
        *summary(runs, machine, min_wait_ms, worthwhile_rows),
        *floor_section(floor, runs, machine.api_workers),
    ]
    for run in runs:
        ceiling, naive, dynamic = (run.runs[k]["achieved_rows_per_s"] for k in ("ceiling", "naive", "dynamic"))
        saturation = run.saturation
        by_fraction = {p["fraction"]: p for p in run.sweep}
        brimful_cpu = sum(run.cpu_us_per_request[n] for n in BRIMFUL_PROCESSES)
        lines += [
            f"## {run.name} model"
            + (f", {run.instances} instances in one Triton server" if run.instances > 1 else "")
            + (
                f" (every call at least {GPU_LIKE_CALL_MS} ms: a memory-bound GPU stand-in)"
                if run.name == "gpu-like"
                else ""
            ),
            "",
            f"![{run.name}](throughput_{run.name}.png)",
            "",
            "| Path | rows/s at saturation | p50 ms | p99 ms | Brimful / this | rows a call | ms a call |",
            "|---|---|---|---|---|---|---|",
        ]
        rows = dict(run.runs)
        if run.ray:
            rows["ray"] = run.ray["saturation"]
        for key, label in (
            ("ceiling", "ceiling: full 64-row batches straight to Triton"),
            ("naive", f"naive: single rows padded to 64, {CLIENTS} clients"),
            ("dynamic", f"Triton's dynamic batcher (Python backend), single rows, {CLIENTS} clients"),
            ("ray", f"Ray Serve @serve.batch(max_batch_size=64), {CLIENTS} clients"),
            ("brimful", f"Brimful end to end, {CLIENTS} clients"),
        ):
            if key not in rows:
                continue
            r = rows[key]
            ratio = saturation / r["achieved_rows_per_s"] if r["achieved_rows_per_s"] else float("nan")
            lines.append(
                f"| {label} | {r['achieved_rows_per_s']:.0f} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {ratio:.2f}x "
                f"| {calls_cells(r)} |"
            )
        lines += [
            "",
            "Rows a call and ms a call: the model executions each path caused, from the statistics of the Triton "
            "that served them (input, model and output time; Brimful's rows a call count its padding), and for "
            "Ray from its app's own count. The dynamic batcher runs in a Triton of its own, the model in Triton's "
            "Python backend, so that its full call costs what the ceiling's does.",
            "",
            f"Offered open loop at its closed-loop peak ({saturation:.0f}/s), Brimful sustained "
            f"**{run.sustained:.0f} rows/s** (p50 {run.runs['brimful-open']['p50_ms']:.0f} ms, p99 "
            f"{run.runs['brimful-open']['p99_ms']:.0f} ms): a closed loop's clients back off when answers slow down, "
            "open-loop arrivals do not. The sweep below is in shares of that sustained load.",
            "",
            "Open-loop Poisson sweep (offered load as a share of what Brimful sustains). Each Brimful run starts on "
            "an empty broker: the embedded one keeps every record and its fetches slow as it fills, which "
            "would charge the runs before to the latencies here:",
            "",
            "| offered /s | share | Brimful rows/s | p50 ms | p99 ms | rows per batch | ms a call "
            "| dynamic rows/s | dynamic p50 ms | dynamic p99 ms | dynamic rows per call | dynamic ms a call |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for p in run.sweep:
            b, d = p["brimful"], p["dynamic"]
            lines.append(
                f"| {p['offered']:.0f} | {p['fraction']:.0%} | {b['achieved_rows_per_s']:.0f} | {b['p50_ms']:.0f} | {b['p99_ms']:.0f} "
                f"| {p['brimful_rows_per_batch']:.1f} | {call_ms(b)} | {d['achieved_rows_per_s']:.0f} | {d['p50_ms']:.0f} "
                f"| {d['p99_ms']:.0f} | {p['dynamic_rows_per_batch']:.1f} | {call_ms(d)} |"
            )
        if run.ray:
            lines += [
                "",
                "Ray Serve under the same open-loop loads:",
                "",
                "| offered /s | share | rows/s | p50 ms | p99 ms | rows a call | ms a call | Ray's CPU us a request |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for fraction in RAY_SWEEP:
                r = run.ray[f"{fraction:g}"]
                lines.append(
                    f"| {r['offered_per_s']:.0f} | {fraction:.0%} | {r['achieved_rows_per_s']:.0f} "
                    f"| {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {calls_cells(r)} | {server_cpu(r)} |"
                )
            lines += [
                "",
                f"Ray's CPU at saturation: {server_cpu(run.ray['saturation'])} us a request (every process of its tree).",
            ]
        else:
            lines += ["", f"Ray Serve (path e) was not measured: {run.ray_missing}"]
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
        lines += [
            f"| **Brimful (api + batcher)** | **{brimful_cpu:.0f}** | |",
            f"| load generator (not Brimful; it shares the cores) | "
            f"{run.runs['brimful']['loadgen_cpu_us_per_request']:.0f} | |",
            "",
        ]
        p99_50, p99_80 = (by_fraction[f]["brimful"]["p99_ms"] for f in (0.5, 0.8))
        p50_5 = by_fraction[0.05]["brimful"]["p50_ms"]
        tuned = run.latency_tuned
        lines += [
            "Ratios:",
            "",
            f"- Brimful / ceiling = {saturation / ceiling:.2f}; sustained (open loop) / ceiling = {run.sustained / ceiling:.2f}",
            f"- Brimful / naive = {saturation / naive:.1f}x",
            f"- Brimful / Triton dynamic batcher = {saturation / dynamic:.2f}",
            *(
                [f"- Brimful / Ray Serve = {saturation / run.ray['saturation']['achieved_rows_per_s']:.1f}x"]
                if run.ray
                else []
            ),
            f"- p99 at 50% and 80% of the sustained load: {p99_50:.0f} ms and {p99_80:.0f} ms",
            f"- p50 at 5%: {p50_5:.0f} ms; with the policy tuned live to flush thin traffic at min_wait "
            f"(`brimful tune min_worthwhile_rows={LATENCY_TUNED_ROWS:g}`): p50 {tuned['p50_ms']:.0f} ms, "
            f"p99 {tuned['p99_ms']:.0f} ms",
            f"- Brimful CPU per request (api + batcher): {brimful_cpu:.0f} us",
            "",
            "Targets:",
            "",
        ]
        lines += cpu_targets(run)
        if run.name == "gpu-like":
            lines += [
                f"- Brimful >= 0.9 x ceiling: {saturation / ceiling:.2f} ({verdict(saturation / ceiling, 0.9)})",
                f"- Brimful >= 20 x naive: {saturation / naive:.1f}x ({verdict(saturation / naive, 20)})",
                f"- p99 <= 500 ms at 80% of saturation: {p99_80:.0f} ms ({verdict(p99_80, 500, False)}); Triton's "
                f"dynamic batcher at the same load: {by_fraction[0.8]['dynamic']['p99_ms']:.0f} ms",
                "",
                "Latency and fill beside Triton's dynamic batcher, at the same offered load in the same run "
                "(targets: p50 within 15 ms and p99 within 30 ms of the dynamic batcher's at 5-50%; rows per "
                "call at least its own at every load):",
                "",
                "| load | Brimful p50 / p99 ms | dynamic p50 / p99 ms | p50 gap | p99 gap | rows per call: Brimful / dynamic |",
                "|---|---|---|---|---|---|",
            ]
            for p in run.sweep:
                b, d = p["brimful"], p["dynamic"]
                p50_gap, p99_gap = b["p50_ms"] - d["p50_ms"], b["p99_ms"] - d["p99_ms"]
                judged = p["fraction"] <= 0.5
                lines.append(
                    f"| {p['fraction']:.0%} | {b['p50_ms']:.0f} / {b['p99_ms']:.0f} | {d['p50_ms']:.0f} / {d['p99_ms']:.0f} "
                    f"| {p50_gap:+.0f} ms{' (' + verdict(p50_gap, 15, False) + ')' if judged else ''} "
                    f"| {p99_gap:+.0f} ms{' (' + verdict(p99_gap, 30, False) + ')' if judged else ''} "
                    f"| {p['brimful_rows_per_batch']:.1f} / {p['dynamic_rows_per_batch']:.1f} "
                    f"({verdict(p['brimful_rows_per_batch'], p['dynamic_rows_per_batch'])}) |"
                )
            lines.append("")
        else:
            lines.append("")
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
                "By where the code lives (busy samples):",
                "",
                "| code | share |",
                "|---|---|",
                *(f"| {group} | {share:.0%} |" for group, share in run.packages),
                "",
                f"The call tree is in [profile_{run.name}.txt](profile_{run.name}.txt).",
                "",
            ]
    return "\n".join(lines)


def call_ms(summary: dict[str, Any]) -> str:
    """The mean model call a run caused, or "-" for a run saved before calls were timed."""
    calls = summary.get("calls")
    return f"{calls['call_ms']:.1f}" if calls and calls.get("calls") else "-"


def calls_cells(summary: dict[str, Any]) -> str:
    """Rows a call and ms a call, as two table cells."""
    calls = summary.get("calls")
    rows = f"{calls['rows_per_call']:.1f}" if calls and calls.get("calls") else "-"
    return f"{rows} | {call_ms(summary)}"


def server_cpu(summary: dict[str, Any]) -> str:
    return f"{summary['server_cpu_us_per_request']:.0f}" if "server_cpu_us_per_request" in summary else "-"
