"""Shared fixtures: one real embedded stack (Tansu, Redis, Triton, API, batcher) per session."""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator, Iterator

import pytest

from brimful.settings import Settings
from brimful.stack import EmbeddedStack, free_port
from tests.task_client import TaskClient


def stack_settings(**overrides: object) -> Settings:
    """Settings for a stack of its own, on free loopback ports."""
    values: dict[str, object] = {
        "kafka_bootstrap": f"127.0.0.1:{free_port()}",
        "redis_url": f"redis://127.0.0.1:{free_port()}/0",
        "triton_url": f"127.0.0.1:{free_port()}",
        "api_port": free_port(),
        "batcher_metrics_port": free_port(),
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


def start_stack(workdir: Path, settings: Settings, **options: object) -> EmbeddedStack:
    stack = EmbeddedStack(settings, workdir, triton_ports=(free_port(), free_port()), **options)  # type: ignore[arg-type]
    stack.start()
    return stack


def fault_file(stack: EmbeddedStack) -> Path:
    """While this file exists, the stack's model fails rows starting with '!flaky'."""
    return stack.workdir / "model-fault"


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    """The whole default pipeline on loopback, shared by the integration tests."""
    workdir = tmp_path_factory.mktemp("stack")
    running = start_stack(
        workdir,
        stack_settings(trace_dir=str(workdir / "traces")),
        model_host_args=("--fault-file", str(workdir / "model-fault")),
    )
    yield running
    running.stop()


@pytest.fixture
async def client(stack: EmbeddedStack) -> AsyncIterator[TaskClient]:
    async with TaskClient(stack.api_url) as task_client:
        yield task_client
