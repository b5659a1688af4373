"""A stack built to be broken: S3-backed broker, Redis with AOF, a slow model with hooks."""

from __future__ import annotations

import os
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from brimful.stack import EmbeddedStack, ManagedProcess, free_port, wait_until
from brimful.stack.processes import port_open
from tests.helpers.stacks import MAX_BACKLOG, MODEL_CALL_MS, durable_stack
from tests.helpers.task_client import TaskClient


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local S3 server (moto) with the broker's bucket."""
    port = free_port()
    workdir = tmp_path_factory.mktemp("s3")
    process = ManagedProcess(
        name="s3",
        argv=[str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        env=dict(os.environ),
        log_path=workdir / "s3.log",
    )
    process.start()
    try:
        wait_until(lambda: port_open(port), 30, "moto_server", process)
        endpoint = f"http://127.0.0.1:{port}"
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/tansu", method="PUT"), timeout=5).close()
        yield endpoint
    finally:
        process.stop()


@pytest.fixture(scope="module")
def fault_stack(tmp_path_factory: pytest.TempPathFactory, s3_server: str) -> Iterator[EmbeddedStack]:
    running = durable_stack(
        tmp_path_factory.mktemp("fault-stack"),
        s3_server,
        ("--call-ms", str(MODEL_CALL_MS), "--hang-ms", "4000"),
        max_backlog=MAX_BACKLOG,
    )
    yield running
    running.stop()


@pytest.fixture
async def fault_client(fault_stack: EmbeddedStack) -> AsyncIterator[TaskClient]:
    async with TaskClient(fault_stack.api_url) as client:
        yield client
