"""Redis command framing: redis-py's Python packer against hiredis's, side by side.

    .venv/bin/python bench/redis_packing.py [--tasks 20000] [--rounds 3]

The task store's Redis work for one task, as ``bench/redis_parser.py`` runs it (queued,
read, running, done with its result published, read; 64 tasks at a time), through a client
whose connections frame commands in Python (redis-py's asyncio default) or in C
(``core/redis_client.HiredisPackingConnection``, what Brimful uses); replies are parsed
by hiredis in both. The figure is the client's CPU time a task. Rounds alternate which goes
first. Each round goes to ``redis_packing.json`` as it ends and ``redis_packing.md`` is
rebuilt; ``--render`` rebuilds the report from the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from redis.asyncio.connection import Connection

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.redis_parser import rounds_table, store_cpu_us_per_task
from bench.saved_report import SavedReport, add_report_arguments, command_line, machine_description
from brimful.core.redis_client import HiredisPackingConnection
from brimful.stack import EmbeddedStack, settings_on_free_ports

PACKERS: dict[str, type[Connection]] = {"python": Connection, "hiredis": HiredisPackingConnection}
DEFAULTS = {"tasks": 20_000, "rounds": 3}


async def cpu_us_per_task(redis_url: str, packer: str, tasks: int) -> float:
    return await store_cpu_us_per_task(redis_url, tasks, f"bench-pack-{packer}", connection_class=PACKERS[packer])


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Redis command framing: redis-py's Python packer against hiredis's",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. Client CPU a task for the task "
        "store's work on one task (queued, read, running, done with its result published, read); replies "
        "parsed by hiredis in both.",
        "",
        *rounds_table(results["rounds"], "python packer", "hiredis packer"),
    ]
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace, redis_url: str, results: dict[str, Any], report: SavedReport) -> None:
    for index in range(args.rounds):
        order = list(PACKERS) if index % 2 == 0 else list(reversed(PACKERS))
        figures = {packer: await cpu_us_per_task(redis_url, packer, args.tasks) for packer in order}
        results["rounds"].append(figures)
        report.save(results)
        print(f"round {index + 1}: " + ", ".join(f"{k} {v:.0f} us/task" for k, v in figures.items()), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=DEFAULTS["tasks"], help="tasks per packer per round")
    parser.add_argument("--rounds", type=int, default=DEFAULTS["rounds"])
    add_report_arguments(parser, "redis_packing")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "redis_packing", render)
    if args.render:
        report.render_again()
        return 0
    results: dict[str, Any] = {
        "command": command_line("bench/redis_packing.py", args, DEFAULTS),
        "machine": machine_description(),
        "rounds": [],
    }
    with tempfile.TemporaryDirectory(prefix="brimful-redis-packing-") as scratch:
        stack = EmbeddedStack(settings_on_free_ports(), Path(scratch))
        stack.start_redis()
        try:
            asyncio.run(run(args, stack.settings.redis_url, results, report))
        finally:
            stack.stop()
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
