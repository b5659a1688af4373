"""Drain: the batcher and the model pool alone, without the front door.

    .venv/bin/python -m bench.studies.drain [--tasks 20000] [--out-dir bench/results] [--quick]

Fills the requests topic with tasks produced directly (recorded queued in Redis first,
as the API does), then starts the batcher and measures rows/s from its first finished
task to its last, against the pool's ceiling (endpoints x 64 rows / call time). Runs:

1. one GPU-like endpoint, 20 ms a call (ceiling 3,200 rows/s);
2. one and four GPU-like endpoints, 80 ms a call (a slower model, so four endpoints' ceiling
   fits what one batcher on a small machine can feed): the scaling ratio;
3. four endpoints, one killed a third of the way in: every task done and correct, none in
   the DLQ, and how long until no batcher sends it calls.

Every step's figures are written to ``drain.json`` as soon as they are measured and the
report ``drain.md`` is rebuilt from it after each; a step that fails is recorded with its
error and the run goes on. ``--render`` rebuilds the report from the saved figures.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis

from bench.harness.saved_report import SavedReport, add_report_arguments, machine_description, out_dir_flag, why
from brimful.core.clock import now_ms
from brimful.core.kafka import ensure_topics, stream_topic
from brimful.core.model_catalogue import TensorSpec, encode_input
from brimful.core.redis_keys import RedisKeys
from brimful.core.task_store import TaskStore
from brimful.schemas import TaskRequest
from brimful.stack import EmbeddedStack, free_port, settings_on_free_ports

ROWS = 64
TEXT = TensorSpec("TEXT", "BYTES", (1,))


def text_of(index: int) -> str:
    return f"drain task {index}"


def expected(index: int) -> dict[str, Any]:
    data = text_of(index).encode()
    return {"SHA256": hashlib.sha256(data).hexdigest(), "LENGTH": len(data)}


async def fill(stack: EmbeddedStack, tasks: int) -> list[str]:
    """Record ``tasks`` queued tasks and put them on the requests topic."""
    settings = stack.settings
    await ensure_topics(settings)
    redis = Redis.from_url(settings.redis_url, max_connections=200)
    store = TaskStore(redis, RedisKeys(settings.key_prefix), settings.result_ttl_s, settings.task_wait_ttl_s)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", linger_ms=5)
    await producer.start()
    task_ids = [f"{index:032x}" for index in range(tasks)]
    try:
        for start in range(0, tasks, 500):
            chunk = range(start, min(tasks, start + 500))
            submitted = now_ms()
            for part in range(chunk.start, chunk.stop, 100):
                await asyncio.gather(
                    *(store.create_queued(task_ids[i], submitted) for i in range(part, min(chunk.stop, part + 100)))
                )
            sends = []
            for i in chunk:
                request = TaskRequest(task_id=task_ids[i], model=settings.model_name, submitted_at_ms=submitted)
                request.inputs["TEXT"].CopyFrom(encode_input(TEXT, text_of(i)))
                sends.append(
                    await producer.send(settings.requests_topic, request.SerializeToString(), key=task_ids[i].encode())
                )
            await asyncio.gather(*sends)
    finally:
        await producer.stop()
        await redis.aclose()
    return task_ids


async def measured_ceiling(stack: EmbeddedStack, seconds: float = 5.0) -> float:
    """Rows/s of full 64-row batches sent straight to every endpoint at once, two calls in
    flight on each (what the pool can do with no Brimful in between), in this run."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.aio as triton_aio

    rows = np.array([f"ceiling {j}".encode() for j in range(ROWS)], dtype=object).reshape(ROWS, 1)
    clients = [triton_aio.InferenceServerClient(url) for url in stack.settings.triton_endpoints]
    done = 0
    stop_at = time.monotonic() + seconds

    async def loop(client: Any) -> None:
        nonlocal done
        while time.monotonic() < stop_at:
            text = grpcclient.InferInput("TEXT", [ROWS, 1], "BYTES")
            text.set_data_from_numpy(rows)
            await client.infer(stack.settings.model_name, [text])
            done += ROWS

    started = time.monotonic()
    try:
        await asyncio.gather(*(loop(c) for c in clients for _ in range(2)))
    finally:
        for client in clients:
            await client.close()
    return done / (time.monotonic() - started)


async def endpoint_views(redis: Redis, keys: RedisKeys) -> list[dict[str, Any]]:
    views = []
    for member in await redis.smembers(keys.batcher_members):
        raw = await redis.get(keys.batcher_status(member.decode()))
        if raw:
            views.append({e["url"]: e for e in json.loads(raw).get("endpoints", [])})
    return views


async def drain(stack: EmbeddedStack, tasks: int, kill: str | None = None) -> dict[str, Any]:
    """Start the batcher on the filled topic and time it until every task is final."""
    settings = stack.settings
    keys = RedisKeys(settings.key_prefix)
    redis = Redis.from_url(settings.redis_url)
    figures: dict[str, Any] = {}
    try:
        await asyncio.to_thread(stack.start_batcher)
        first_done_at = None
        samples: list[tuple[float, int]] = []
        killed_at = off_after = None
        deadline = time.monotonic() + 600
        while True:
            done = int(await redis.hget(keys.stats, "tasks_done") or 0)
            failed = int(await redis.hget(keys.stats, "tasks_failed") or 0)
            now = time.monotonic()
            if done + failed and first_done_at is None:
                first_done_at = now
            samples.append((now, done + failed))
            if kill and killed_at is None and done + failed >= tasks // 3:
                stack.processes[kill].kill()
                killed_at = time.monotonic()
            if killed_at is not None and off_after is None:
                victim = settings.triton_endpoints[stack.model_host_names.index(kill)]  # type: ignore[arg-type]
                views = await endpoint_views(redis, keys)
                if views and all(view.get(victim, {}).get("breaker", "closed") != "closed" for view in views):
                    off_after = time.monotonic() - killed_at
            if done + failed >= tasks:
                break
            if now > deadline:
                raise RuntimeError(f"drain stalled at {done + failed} of {tasks}")
            await asyncio.sleep(0.02)
        assert first_done_at is not None
        elapsed = samples[-1][0] - first_done_at
        figures.update(seconds=round(elapsed, 3), rows_per_s=round(tasks / elapsed, 1), failed=failed, done=done)
        if kill:
            figures["traffic_off_after_s"] = None if off_after is None else round(off_after, 3)
            store = TaskStore(redis, keys, settings.result_ttl_s, settings.task_wait_ttl_s)
            wrong = 0
            for index in range(tasks):
                record = await store.get(f"{index:032x}")
                if record is None or record.status.value != "done" or record.outputs != expected(index):
                    wrong += 1
            figures["wrong_or_missing"] = wrong
            figures["dead_letters"] = sum([len(chunk) async for chunk in stream_topic(settings, settings.dlq_topic)])
        stats = {k.decode(): int(v) for k, v in (await redis.hgetall(keys.stats)).items()}
        figures["rows_per_call"] = round(
            stats.get("rows_dispatched", 0) / max(1, stats.get("batches_dispatched", 1)), 2
        )
    finally:
        await redis.aclose()
    return figures


def run_step(
    name: str, endpoints: int, call_ms: float, tasks: int, kill: bool, results: dict[str, Any], save: Any
) -> None:
    ceiling = endpoints * ROWS / (call_ms / 1000)
    entry: dict[str, Any] = {"endpoints": endpoints, "call_ms": call_ms, "tasks": tasks, "ceiling_rows_per_s": ceiling}
    print(
        f"{name}: {endpoints} endpoint(s), {call_ms:g} ms a call, {tasks} tasks (ceiling {ceiling:.0f} rows/s)",
        flush=True,
    )
    workdir = Path(tempfile.mkdtemp(prefix="brimful-drain-"))
    settings = settings_on_free_ports(
        triton_url=",".join(f"127.0.0.1:{free_port()}" for _ in range(endpoints)),
        topic_partitions=4,
        max_in_flight=max(8, 2 * endpoints * 2),
        max_in_flight_per_partition=max(2, endpoints * 2),
        batcher_metrics_port=0,
        tuning_poll_ms=100,  # the status board, where the kill step watches the breakers, every 100 ms
    )
    stack = EmbeddedStack(settings, workdir, model_host_args=("--call-ms", str(call_ms)))
    started = time.monotonic()
    try:
        stack.start(with_api=False, with_batcher=False)
        entry["measured_ceiling_rows_per_s"] = round(asyncio.run(measured_ceiling(stack)), 1)
        asyncio.run(fill(stack, tasks))
        entry.update(asyncio.run(drain(stack, tasks, kill=stack.model_host_names[-1] if kill else None)))
        entry["of_ceiling"] = round(entry["rows_per_s"] / ceiling, 3)
        entry["of_measured_ceiling"] = round(entry["rows_per_s"] / entry["measured_ceiling_rows_per_s"], 3)
        print(
            f"  {entry['rows_per_s']:.0f} rows/s = {entry['of_ceiling']:.2f}x the nominal ceiling, "
            f"{entry['of_measured_ceiling']:.2f}x the measured one ({entry['measured_ceiling_rows_per_s']:.0f}); "
            f"{entry['rows_per_call']} rows per call",
            flush=True,
        )
    except Exception as error:  # recorded, and the run goes on
        entry["error"] = why(error, 500)
        print(f"  failed: {entry['error']}", flush=True)
    finally:
        stack.stop()
        entry["wall_s"] = round(time.monotonic() - started, 1)
        results["steps"][name] = entry
        save()


def render(results: dict[str, Any]) -> str:
    steps = results["steps"]
    lines = [
        "# Drain: the batcher and the model pool, without the front door",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. Each step fills the requests topic "
        "(4 partitions) with tasks produced directly, then starts one batcher and times it from its first "
        "finished task to its last. GPU-like endpoints: PyTriton hosts of the reference model, every call "
        "taking at least the stated time; each endpoint runs one call at a time (`BRIMFUL_ENDPOINT_INSTANCES`) and has 2 slots (`BRIMFUL_ENDPOINT_CAPACITY`).",
        "",
        "The nominal ceiling is endpoints x 64 rows / call time; the measured one is what the same endpoints "
        "did in the same run with full batches sent straight to them, two calls in flight on each (each "
        "PyTriton call also pays its own IPC and hashing on top of the stated time).",
        "",
        "| step | endpoints | call ms | tasks | rows/s | nominal ceiling | of nominal | measured ceiling "
        "| of measured | rows per call |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in steps.items():
        if "error" in s:
            lines.append(
                f"| {name} | {s['endpoints']} | {s['call_ms']:g} | {s['tasks']} | failed: {s['error']} | | | | | |"
            )
            continue
        lines.append(
            f"| {name} | {s['endpoints']} | {s['call_ms']:g} | {s['tasks']} | {s['rows_per_s']:.0f} | "
            f"{s['ceiling_rows_per_s']:.0f} | {s['of_ceiling']:.2f}x | {s['measured_ceiling_rows_per_s']:.0f} "
            f"| {s['of_measured_ceiling']:.2f}x | {s['rows_per_call']} |"
        )
    lines.append("")
    one, four = steps.get("one-slow", {}), steps.get("four-slow", {})
    if "rows_per_s" in one and "rows_per_s" in four:
        lines.append(
            f"- Four endpoints drain **{four['rows_per_s'] / one['rows_per_s']:.2f}x** the rows/s of one "
            "(same model, same run)."
        )
    fast = steps.get("one-fast", {})
    if "of_ceiling" in fast:
        lines.append(
            f"- One endpoint at 20 ms a call: **{fast['of_measured_ceiling']:.2f}x** its measured ceiling "
            f"({fast['of_ceiling']:.2f}x the nominal one)."
        )
    killed = steps.get("four-kill-one", {})
    if "rows_per_s" in killed:
        lines.append(
            f"- One of four endpoints killed a third of the way in: {killed['done']} of {killed['tasks']} tasks done, "
            f"{killed['wrong_or_missing']} wrong or missing, {killed['failed']} failed, {killed['dead_letters']} "
            f"dead letters; every batcher had stopped sending it calls (its circuit open) "
            f"{killed['traffic_off_after_s']} s after the kill; the drain went on at {killed['rows_per_s']:.0f} rows/s."
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--quick", action="store_true", help="2,000 tasks a step: a smoke run")
    add_report_arguments(parser, "drain")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "drain", render)
    if args.render:
        report.render_again()
        return
    tasks = 2_000 if args.quick else args.tasks
    results: dict[str, Any] = {
        "command": "python -m bench.studies.drain"
        + (" --quick" if args.quick else f" --tasks {tasks}")
        + out_dir_flag(args.out_dir),
        "machine": machine_description(),
        "steps": {},
    }

    def save() -> None:
        report.save(results)

    run_step("one-fast", 1, 20, tasks, False, results, save)
    run_step("one-slow", 1, 80, tasks // 4, False, results, save)
    run_step("four-slow", 4, 80, tasks, False, results, save)
    run_step("four-kill-one", 4, 80, tasks, True, results, save)
    print(report.md_path.read_text())


if __name__ == "__main__":
    main()
