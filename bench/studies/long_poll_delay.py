"""Long-poll delay: from a result stored in Redis to the waiting client's answer.

    .venv/bin/python -m bench.studies.long_poll_delay [--samples 300] [--out bench/results/long_poll_delay.md]

Starts the embedded stack on free ports, then measures three ways:

1. One waiter at a time: a queued task is created, a client holds
   ``GET /v1/tasks/{id}?wait=10``, and the bench stores the result with the workers'
   own ``TaskStore.mark_done``. Delay = answer received - ``mark_done`` returned.
   (``mark_done`` returning is when the store is acknowledged; the push left Redis inside
   that same script, so this slightly under-states, and the figure from before the call
   over-states. Both are printed.)
2. One batch of waiters at once: 64 held GETs, one ``mark_done`` finishing all 64, as a
   worker finishes a batch.
3. End to end through the model: ``POST /v1/tasks?wait=10``; delay = answer received -
   the task's ``updated_at_ms`` (the time the worker stored it; millisecond resolution).

The waiter is woken by Redis pub/sub (``api/tasks/task_waiters.py``); there is no polling loop.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
from redis.asyncio import Redis

from brimful.core.clock import now_ms
from brimful.core.redis_keys import RedisKeys
from brimful.core.task_store import TaskStore
from brimful.stack import EmbeddedStack, settings_on_free_ports

REGISTER_S = 0.03  # time given to a held GET to register its waiter before the result lands


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def describe(values_ms: list[float]) -> str:
    return (
        f"{statistics.median(values_ms):.2f} | {quantile(values_ms, 0.9):.2f} | "
        f"{quantile(values_ms, 0.99):.2f} | {max(values_ms):.2f}"
    )


async def held_get(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url, params={"wait": "10"}) as response:
        body = await response.json()
        received = time.perf_counter()
    if body.get("status") != "done":
        raise RuntimeError(f"long-poll answered before the result: {body}")
    return received


async def one_at_a_time(
    session: aiohttp.ClientSession, api: str, store: TaskStore, samples: int
) -> tuple[list[float], list[float]]:
    after, before = [], []
    for _ in range(samples):
        task_id = uuid.uuid4().hex
        await store.create_queued(task_id, now_ms())
        waiter = asyncio.create_task(held_get(session, f"{api}/v1/tasks/{task_id}"))
        await asyncio.sleep(REGISTER_S)
        started = time.perf_counter()
        await store.mark_done({task_id: {"Y": 1}})
        stored = time.perf_counter()
        received = await waiter
        after.append((received - stored) * 1000)
        before.append((received - started) * 1000)
    return after, before


async def many_at_once(session: aiohttp.ClientSession, api: str, store: TaskStore, waiters: int) -> list[float]:
    task_ids = [uuid.uuid4().hex for _ in range(waiters)]
    for task_id in task_ids:
        await store.create_queued(task_id, now_ms())
    pending = [asyncio.create_task(held_get(session, f"{api}/v1/tasks/{t}")) for t in task_ids]
    await asyncio.sleep(REGISTER_S * 20)
    await store.mark_done({task_id: {"Y": 1} for task_id in task_ids})
    stored = time.perf_counter()
    return [(received - stored) * 1000 for received in await asyncio.gather(*pending)]


async def end_to_end(session: aiohttp.ClientSession, api: str, samples: int) -> list[float]:
    delays = []
    for i in range(samples):
        async with session.post(
            f"{api}/v1/tasks", params={"wait": "10"}, json={"inputs": {"TEXT": f"lp {i}"}}
        ) as response:
            body = await response.json()
            received_ms = time.time() * 1000
        if body.get("status") != "done":
            raise RuntimeError(f"no result inline: {body}")
        delays.append(received_ms - body["updated_at_ms"])
    return delays


async def measure(stack: EmbeddedStack, samples: int) -> str:
    settings = stack.settings
    redis = Redis.from_url(settings.redis_url)
    store = TaskStore(redis, RedisKeys(settings.key_prefix), settings.result_ttl_s)
    connector = aiohttp.TCPConnector(limit=0)
    try:
        async with aiohttp.ClientSession(connector=connector) as session:
            await one_at_a_time(session, stack.api_url, store, 20)  # warm connections and caches
            after, before = await one_at_a_time(session, stack.api_url, store, samples)
            fan_out = await many_at_once(session, stack.api_url, store, 64)
            e2e = await end_to_end(session, stack.api_url, min(samples, 200))
    finally:
        await redis.aclose()
    return "\n".join(
        [
            "# Long-poll delay: result stored to answer received",
            "",
            "Command: `.venv/bin/python -m bench.studies.long_poll_delay`, on the embedded stack (one API process).",
            "Target (issue: front door): median under 5 ms.",
            "",
            "| Measure | samples | median ms | p90 ms | p99 ms | max ms |",
            "|---|---|---|---|---|---|",
            f"| one waiter, from `mark_done` returned | {len(after)} | {describe(after)} |",
            f"| one waiter, from `mark_done` called (upper bound) | {len(before)} | {describe(before)} |",
            f"| 64 waiters (one batch) finished by one store | {len(fan_out)} | {describe(fan_out)} |",
            f"| end to end through the model, from the worker's `updated_at_ms` (1 ms resolution) | {len(e2e)} | {describe(e2e)} |",
            "",
            f"Median (one waiter): **{statistics.median(after):.2f} ms**; "
            f"{'meets' if statistics.median(after) < 5 else 'misses'} the 5 ms target.",
            "",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parents[1] / "results" / "long_poll_delay.md"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="brimful-bench-") as workdir:
        stack = EmbeddedStack(settings_on_free_ports(), Path(workdir))
        stack.start()
        try:
            report = asyncio.run(measure(stack, args.samples))
        finally:
            stack.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
