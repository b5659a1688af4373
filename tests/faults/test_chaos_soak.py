"""A chaos soak: steady load while a seeded schedule kills and restarts the batcher, the
model endpoint, Redis and the broker, and drops the pub/sub connections. At the end every
task that got a 202 is final: done with its own correct result, or failed with its dead
letter; none is lost and none has two dead letters.

Two minutes in ``make test``; ``make soak`` runs it longer (BRIMFUL_SOAK_S) and writes its
figures to docs/reliability.md (BRIMFUL_SOAK_REPORT).
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import time
from pathlib import Path
from typing import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from brimful.stack import EmbeddedStack
from tests.conftest import rows_seen_by_model
from tests.faults.conftest import durable_stack
from tests.faults.test_faults import SteadyLoad
from tests.integration.test_pipeline import expected_outputs, read_dead_letters
from tests.task_client import TaskClient

SOAK_S = float(os.environ.get("BRIMFUL_SOAK_S", "120"))
SEED = int(os.environ.get("BRIMFUL_SOAK_SEED", "7"))
REPORT = os.environ.get("BRIMFUL_SOAK_REPORT", "")
LOAD_PER_S = 20.0
FAULTS = ("batcher", "model", "redis", "broker", "pubsub")

pytestmark = pytest.mark.timeout(SOAK_S + 600)


@pytest.fixture(scope="module")
def chaos_stack(tmp_path_factory: pytest.TempPathFactory, s3_server: str) -> Iterator[EmbeddedStack]:
    workdir = tmp_path_factory.mktemp("chaos-stack")
    running = durable_stack(workdir, s3_server, ("--call-ms", "20", "--seen-log", str(workdir / "model-seen.log")))
    yield running
    running.stop()


@pytest.fixture
async def chaos_client(chaos_stack: EmbeddedStack) -> AsyncIterator[TaskClient]:
    async with TaskClient(chaos_stack.api_url) as client:
        yield client


async def inject(stack: EmbeddedStack, fault: str, rng: random.Random) -> None:
    """One fault, and the restart that ends it (what a supervisor or on-call would do)."""
    if fault == "pubsub":
        redis = Redis.from_url(stack.settings.redis_url)
        try:
            await redis.client_kill_filter(_type="pubsub")
        finally:
            await redis.aclose()
        return
    name = {"batcher": "batcher-0", "model": "triton", "redis": "redis", "broker": "broker"}[fault]
    stack.processes[name].kill()
    await asyncio.sleep(rng.uniform(0.5, 3.0))  # the outage lasts a while: that is the fault
    await asyncio.to_thread(stack.restart, name)
    if fault == "broker":
        await asyncio.to_thread(stack.wait_for_batchers)


async def test_every_accepted_task_ends_right_through_a_chaos_schedule(
    chaos_stack: EmbeddedStack, chaos_client: TaskClient
) -> None:
    rng = random.Random(SEED)
    schedule: list[str] = []
    load = SteadyLoad(chaos_client, rate_per_s=LOAD_PER_S).start()
    started = time.monotonic()
    while time.monotonic() - started < SOAK_S:
        if len(schedule) % len(FAULTS) == 0:
            cycle = list(FAULTS)
            rng.shuffle(cycle)  # every kind of fault in each cycle, in a seeded order
        fault = cycle[len(schedule) % len(FAULTS)]
        await asyncio.sleep(rng.uniform(3.0, 8.0))  # steady load between faults: the schedule's own pace
        await inject(chaos_stack, fault, rng)
        schedule.append(fault)
    await load.stop()
    elapsed = time.monotonic() - started

    answers = await asyncio.gather(
        *(chaos_client.wait_final(task_id, timeout_s=240, interval_s=0.25) for task_id in load.accepted),
        return_exceptions=True,
    )
    finals = [answer for answer in answers if isinstance(answer, dict)]
    stuck = [answer for answer in answers if not isinstance(answer, dict)]  # not final 4 minutes on
    letters = collections.Counter(letter.request.task_id for letter in await read_dead_letters(chaos_stack))
    done = [task for task in finals if task["status"] == "done"]
    failed = [task for task in finals if task["status"] == "failed"]
    wrong = [task for task in done if task["outputs"] != expected_outputs(load.accepted[task["task_id"]])]
    unexplained = [task for task in failed if letters[task["task_id"]] != 1]
    seen = collections.Counter(rows_seen_by_model(chaos_stack))
    rerun_rows = sum(count - 1 for text, count in seen.items() if text in set(load.accepted.values()) and count > 1)
    figures = {
        "seconds": round(elapsed),
        "seed": SEED,
        "offered per second": LOAD_PER_S,
        "faults": dict(collections.Counter(schedule)),
        "accepted (202)": len(load.accepted),
        "refused (503 or no answer, during faults)": load.refused,
        "done, correct": len(done) - len(wrong),
        "failed, with their dead letter": len(failed) - len(unexplained),
        "lost or wrong": len(wrong) + len(unexplained),
        "not final 4 minutes after the load stopped": len(stuck),
        "rows the model ran twice (redelivery after a kill)": rerun_rows,
    }
    print("\nchaos soak:", figures)
    if stuck:  # what the batchers say of their partitions: offsets committed, the log's end, rows held
        print("batchers at the end:", (await chaos_client.stats())["batchers"])
    if REPORT:
        write_report(Path(REPORT), figures, schedule)
    assert set(FAULTS) <= set(schedule), f"the soak was too short for every fault: {schedule}"
    assert not wrong, wrong[:3]
    assert not unexplained, unexplained[:3]
    assert not stuck, stuck[:3]


def write_report(path: Path, figures: dict[str, object], schedule: list[str]) -> None:
    """Rewrite the page's figures; the sections after them (findings, from ``## `` on) stay."""
    def cell(value: object) -> str:
        if isinstance(value, dict):
            return ", ".join(f"{key} {count}" for key, count in value.items())
        return str(value)

    rows = "\n".join(f"| {name} | {cell(value)} |" for name, value in figures.items())
    kept = ""
    if path.exists() and "\n## " in path.read_text():
        kept = "\n## " + path.read_text().split("\n## ", 1)[1]
    path.write_text(
        "# Reliability: the chaos soak\n\n"
        "`make soak` (tests/faults/test_chaos_soak.py with BRIMFUL_SOAK_S and BRIMFUL_SOAK_REPORT) runs steady load\n"
        "against the embedded stack, with the broker on S3 storage and Redis with AOF, while a seeded schedule kills\n"
        "and restarts the batcher, the model endpoint, Redis and the broker, and drops the pub/sub connections.\n"
        "Every task that got a 202 must end done with its own correct result, or failed with exactly one dead\n"
        "letter. `make test` runs the same soak for two minutes. A run rewrites these figures.\n\n"
        f"Last run ({time.strftime('%Y-%m-%d')}, {figures['seconds']} s, seed {figures['seed']}):\n\n"
        f"| figure | value |\n|---|---|\n{rows}\n\nFault order: {', '.join(schedule)}.\n{kept}"
    )
