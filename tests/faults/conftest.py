"""A stack built to be broken: S3-backed broker, Redis with AOF, a slow model with hooks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from brimful.stack import EmbeddedStack
from tests.helpers.s3_server import running_s3
from tests.helpers.stacks import MAX_BACKLOG, MODEL_CALL_MS, durable_stack
from tests.helpers.task_client import TaskClient


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local S3 server with the broker's bucket (tests/helpers/s3_server.py)."""
    with running_s3(tmp_path_factory.mktemp("s3")) as endpoint:
        yield endpoint


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
