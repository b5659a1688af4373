"""`brimful up`: reaches readiness, serves, and stops cleanly on Ctrl-C or SIGTERM,
leaving no process behind; and the embedded stack's broker, emptied by a restart."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from brimful.core.topic_generations import MEASURED_PERIOD_S
from brimful.stack import EmbeddedStack, settings_env, wait_until
from brimful.stack.processes import http_ok
from tests.helpers.stacks import stack_settings, start_stack
from tests.helpers.task_client import TaskClient


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize(
    ("stop_signal", "api_workers"),
    [(signal.SIGINT, 1), (signal.SIGTERM, 2)],
    ids=["ctrl-c", "sigterm-two-api-workers"],
)
async def test_brimful_up_serves_then_stops_leaving_nothing_behind(
    tmp_path: Path, stop_signal: int, api_workers: int
) -> None:
    # Its topics rotating, as `make up` runs it (``embedded_settings``).
    settings = stack_settings(api_workers=api_workers, topic_rotation_s=MEASURED_PERIOD_S)
    env = settings_env(settings)
    process = subprocess.Popen(
        [sys.executable, "-m", "brimful.cli", "up", "--workdir", str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    api = f"http://127.0.0.1:{settings.api_port}"
    try:
        wait_until(lambda: http_ok(f"{api}/readyz"), 90, "brimful up")
        for i in range(10):  # a connection each: with several workers, each may land on any of them
            async with TaskClient(api) as client:
                task = await client.wait_final(await client.submit({"TEXT": f"lifecycle {i}"}))
            assert task["status"] == "done"
        # Every worker's count is in the one /metrics answer.
        with urllib.request.urlopen(f"{api}/metrics", timeout=10) as answer:
            metrics = answer.read().decode()
        submitted = re.search(
            rf'^brimful_tasks_submitted_total\{{model="{settings.model_name}"\}} (\S+)$', metrics, re.M
        )
        assert submitted is not None and float(submitted.group(1)) == 10, metrics[-2000:]
        started = descendants(process.pid)
        # broker, redis, the Triton host with its server, the API (a supervisor and its
        # workers when there are several) and the batcher
        assert len(started) >= 6 + (api_workers if api_workers > 1 else 0), started
    finally:
        process.send_signal(stop_signal)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output.decode()
    assert b"stopped" in output
    deadline = time.monotonic() + 10
    while (left := [pid for pid in started if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left behind: {left}"
    assert not http_ok(f"{api}/healthz")


def batcher_pids(up: int) -> set[int]:
    """The batcher processes below ``brimful up``."""
    found = set()
    for pid in descendants(up):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"brimful.batcher" in command and alive(pid):
            found.add(pid)
    return found


async def test_a_killed_batcher_is_started_again_while_the_api_keeps_accepting(tmp_path: Path) -> None:
    settings = stack_settings(topic_rotation_s=MEASURED_PERIOD_S)  # as `make up` runs it
    api = f"http://127.0.0.1:{settings.api_port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "brimful.cli", "up", "--workdir", str(tmp_path)],
        env=settings_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert process.stdout is not None
        started_lines = []
        while not started_lines or b"ready in" not in started_lines[-1]:  # up says so once all joined
            started_lines.append(process.stdout.readline())
            assert started_lines[-1], b"".join(started_lines).decode()
        (first,) = batcher_pids(process.pid)
        os.kill(first, signal.SIGKILL)
        async with TaskClient(api) as client:
            task_id = await client.submit({"TEXT": "while the batcher is down"})  # the API still accepts
            wait_until(lambda: len(batcher_pids(process.pid) - {first}) == 1, 60, "a new batcher")
            task = await client.wait_final(task_id, timeout_s=60)
        assert task["status"] == "done"
        assert process.poll() is None, "brimful up stopped when one child died"
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output.decode()
    assert b"batcher-0 exited" in output and b"batcher-0 started again" in output


def requests_highwater(stack: EmbeddedStack) -> int:
    """The requests topic's high watermark, summed over partitions, as the batcher reports it."""
    url = f"http://127.0.0.1:{stack.settings.batcher_metrics_port}/status"
    with urllib.request.urlopen(url, timeout=5) as answer:
        partitions = json.load(answer)["partitions"]
    return sum(int(p["highwater"]) for p in partitions.values())


async def test_an_emptied_broker_starts_from_nothing_and_the_stack_serves_again(tmp_path: Path) -> None:
    stack = start_stack(tmp_path, stack_settings(topic_partitions=1))
    try:
        async with TaskClient(stack.api_url) as client:
            for i in range(5):
                assert (await client.wait_final(await client.submit({"TEXT": f"before {i}"})))["status"] == "done"
            wait_until(lambda: requests_highwater(stack) == 5, 10, "the batcher to see all five records")
            stack.empty_broker()
        async with TaskClient(stack.api_url) as client:  # the API was restarted with the broker
            task = await client.wait_final(await client.submit({"TEXT": "after"}))
            assert task["status"] == "done"
            wait_until(lambda: requests_highwater(stack) == 1, 10, "a topic holding only the new record")
    finally:
        stack.stop()
