"""Redis reply parsing: redis-py's pure-Python parser against hiredis, side by side.

    .venv/bin/python bench/redis_parser.py [--tasks 20000] [--rounds 3] [--out-dir bench/results]

The API's and the batcher's Redis work for one task, through the real ``TaskStore`` on a
real ``redis-server``: record it queued (the admission script), read it, mark it running,
store its result (publishing it), and read it again, 64 tasks at a time as a batch would.
Each round runs both parsers in turn on fresh task ids; the figure is the client's CPU time
per task (``time.process_time``), the cost a Brimful process pays for its Redis client.
Rounds alternate which parser goes first, so a busy neighbour on the machine hurts both.

Every round is written to ``redis_parser.json`` as it finishes and ``redis_parser.md`` is
rebuilt from it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

# redis-py names its parser classes only in a private module; the public switch is installing hiredis.
from redis._parsers import _AsyncHiredisParser, _AsyncRESP2Parser
from redis.asyncio import ConnectionPool, Redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from brimful.core.clock import now_ms
from brimful.core.redis_keys import RedisKeys
from brimful.core.task_store import TaskStore
from brimful.stack import EmbeddedStack, settings_on_free_ports

PARSERS = {"python": _AsyncRESP2Parser, "hiredis": _AsyncHiredisParser}
BATCH = 64
OUTPUTS = {"SHA256": "0" * 64, "LENGTH": 5}


async def one_batch(store: TaskStore) -> None:
    ids = [uuid.uuid4().hex for _ in range(BATCH)]
    submitted = now_ms()
    await asyncio.gather(*(store.create_queued(task_id, submitted, "bench") for task_id in ids))
    await asyncio.gather(*(store.get(task_id) for task_id in ids))
    await store.mark_running(ids)
    await store.mark_done(dict.fromkeys(ids, OUTPUTS))
    await asyncio.gather(*(store.get(task_id) for task_id in ids))


async def cpu_us_per_task(redis_url: str, parser: str, tasks: int) -> float:
    return await store_cpu_us_per_task(redis_url, tasks, f"bench-{parser}", parser_class=PARSERS[parser])


async def store_cpu_us_per_task(redis_url: str, tasks: int, prefix: str, **pool_options: Any) -> float:
    """The client's CPU a task for ``tasks`` tasks' store work (``one_batch``), through a
    pool made with ``pool_options``, under the key prefix ``prefix``."""
    pool = ConnectionPool.from_url(redis_url, max_connections=BATCH, **pool_options)
    redis = Redis(connection_pool=pool)
    store = TaskStore(redis, RedisKeys(prefix), ttl_s=600)
    try:
        await one_batch(store)  # connections opened, scripts loaded: not timed
        started = time.process_time()
        for _ in range(tasks // BATCH):
            await one_batch(store)
        return (time.process_time() - started) / (tasks // BATCH * BATCH) * 1e6
    finally:
        await redis.aclose()


def rounds_table(rounds: list[dict[str, float]], python_label: str, hiredis_label: str) -> list[str]:
    """The report's table of alternated rounds (``python`` and ``hiredis`` us a task each),
    with the median of their ratios; shared with ``bench/redis_packing.py``."""
    lines = [
        f"| round | {python_label} us/task | {hiredis_label} us/task | hiredis / python |",
        "|---|---|---|---|",
    ]
    ratios = []
    for index, round_ in enumerate(rounds, 1):
        ratio = round_["hiredis"] / round_["python"]
        ratios.append(ratio)
        lines.append(f"| {index} | {round_['python']:.0f} | {round_['hiredis']:.0f} | {ratio:.2f} |")
    if ratios:
        lines += ["", f"Median ratio: **{sorted(ratios)[len(ratios) // 2]:.2f}**."]
    return lines


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Redis reply parsing: pure Python against hiredis",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. Client CPU per task for the "
        "task store's work on one task (queued, read, running, done with its result published, read).",
        "",
        *rounds_table(results["rounds"], "python parser", "hiredis"),
    ]
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace, redis_url: str, save: Any) -> None:
    for index in range(args.rounds):
        order = list(PARSERS) if index % 2 == 0 else list(reversed(PARSERS))
        figures = {parser: await cpu_us_per_task(redis_url, parser, args.tasks) for parser in order}
        save(figures)
        print(f"round {index + 1}: " + ", ".join(f"{k} {v:.0f} us/task" for k, v in figures.items()), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks per parser per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "command": "python bench/redis_parser.py"
        + (f" --tasks {args.tasks}" if args.tasks != 20_000 else "")
        + (f" --rounds {args.rounds}" if args.rounds != 3 else ""),
        "machine": f"{platform.machine()}, Python {platform.python_version()}",
        "rounds": [],
    }

    def save(figures: dict[str, float]) -> None:
        results["rounds"].append(figures)
        (args.out_dir / "redis_parser.json").write_text(json.dumps(results, indent=2))
        (args.out_dir / "redis_parser.md").write_text(render(results))

    with tempfile.TemporaryDirectory(prefix="brimful-redis-bench-") as scratch:
        stack = EmbeddedStack(settings_on_free_ports(), Path(scratch))
        stack.start_redis()
        try:
            asyncio.run(run(args, stack.settings.redis_url, save))
        finally:
            stack.stop()
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
