"""A stack built to be broken: S3-backed broker, Redis with AOF, a slow model with hooks."""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path
from typing import AsyncIterator, Iterator

import pytest

from brimful.stack import EmbeddedStack, ManagedProcess, free_port, wait_until
from brimful.stack.processes import port_open
from tests.conftest import stack_settings, start_stack
from tests.task_client import TaskClient

WIDE_PARTITIONS = 4
MODEL_CALL_MS = 100  # full batches: 640 rows/s at most, so a flood can outrun it
MAX_BACKLOG = 300


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


def durable_stack(workdir: Path, s3_server: str, model_host_args: tuple[str, ...], **settings: object) -> EmbeddedStack:
    """A stack that keeps what it accepted across restarts, as production does: the broker
    on the local S3 server, Redis with AOF."""
    return start_stack(
        workdir,
        stack_settings(
            infer_timeout_s=1.5,
            breaker_max_open_s=1.0,
            kafka_request_timeout_ms=5000,
            kafka_fetch_max_wait_ms=500,  # Tansu on S3 answers shorter fetch waits with nothing, forever
            **settings,
        ),
        model_host_args=model_host_args,
        redis_append_only=True,
        broker_storage="s3://tansu/",
        broker_env=s3_broker_env(s3_server),
    )


def s3_broker_env(s3_server: str) -> dict[str, str]:
    """What the broker needs to keep its log on the local S3 server."""
    return {
        "AWS_ENDPOINT": s3_server,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "brimful",
        "AWS_SECRET_ACCESS_KEY": "brimful",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


@pytest.fixture(scope="module")
def fault_stack(tmp_path_factory: pytest.TempPathFactory, s3_server: str) -> Iterator[EmbeddedStack]:
    running = durable_stack(
        tmp_path_factory.mktemp("fault-stack"), s3_server, ("--call-ms", str(MODEL_CALL_MS), "--hang-ms", "4000"),
        max_backlog=MAX_BACKLOG,
    )
    yield running
    running.stop()


@pytest.fixture
async def fault_client(fault_stack: EmbeddedStack) -> AsyncIterator[TaskClient]:
    async with TaskClient(fault_stack.api_url) as client:
        yield client


def start_wide_stack(workdir: Path, **settings: object) -> EmbeddedStack:
    """A stack in the production shape the embedded one lacks: the requests topic on
    WIDE_PARTITIONS partitions and two model endpoints of two slots each, the model host
    logging every row it computes (``tests.conftest.rows_seen_by_model``)."""
    base = stack_settings(topic_partitions=WIDE_PARTITIONS, endpoint_capacity=2, **settings)
    two_endpoints = base.model_copy(update={"triton_url": f"{base.triton_url},127.0.0.1:{free_port()}"})
    return start_stack(workdir, two_endpoints, model_host_args=("--seen-log", str(workdir / "model-seen.log")))
