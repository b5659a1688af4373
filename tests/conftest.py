"""Shared fixtures: one real embedded stack (Tansu, Redis, Triton, API, batcher) per session."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import pytest

from brimful.commands.up import EMBEDDED_MODELS
from brimful.core.settings import Settings
from brimful.stack import EmbeddedStack, settings_on_free_ports
from tests.task_client import TaskClient


def stack_settings(**overrides: object) -> Settings:
    """Settings for a stack of its own, on free loopback ports (auth off unless overridden)."""
    return settings_on_free_ports(**overrides)


def start_stack(workdir: Path, settings: Settings, **options: object) -> EmbeddedStack:
    stack = EmbeddedStack(settings, workdir, **options)  # type: ignore[arg-type]
    stack.start()
    return stack


def rows_seen_by_model(stack: EmbeddedStack) -> list[str]:
    """Every real row the stack's model has been given so far."""
    path = stack.workdir / "model-seen.log"
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def fault_file(stack: EmbeddedStack) -> Path:
    """While this file exists, the stack's model fails rows starting with '!flaky'."""
    return stack.workdir / "model-fault"


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    """The whole default pipeline on loopback, serving the models ``make up`` serves,
    shared by the integration tests."""
    workdir = tmp_path_factory.mktemp("stack")
    running = start_stack(
        workdir,
        # The second model marked not deterministic: its tasks never share a result.
        stack_settings(trace_dir=str(workdir / "traces"), models=EMBEDDED_MODELS,
                       uncacheable_models="brimful_reference_16"),
        model_host_args=("--fault-file", str(workdir / "model-fault"), "--seen-log", str(workdir / "model-seen.log")),
    )
    yield running
    running.stop()


@pytest.fixture
async def client(stack: EmbeddedStack) -> AsyncIterator[TaskClient]:
    async with TaskClient(stack.api_url) as task_client:
        yield task_client


async def policy_seen_by_batchers(client: TaskClient) -> list[dict[str, Any]]:
    """The live policy of each batcher on the status board; waits (up to 10 s) while the
    board is empty, so "every batcher applies it" is never true of none."""
    deadline = time.monotonic() + 10
    while not (batchers := (await client.stats())["batchers"]):
        assert time.monotonic() < deadline, "no batcher on the status board"
        await asyncio.sleep(0.05)
    return [batcher["params"] for batcher in batchers]


async def tune(client: TaskClient, **changes: float) -> tuple[int, Any]:
    return await client.request("PATCH", "/v1/admin/policy", json=changes)


async def tune_live(client: TaskClient, **changes: float) -> None:
    """Change the live policy and wait (up to 5 s) until every batcher applies it."""
    status, body = await tune(client, **changes)
    assert status == 200, body
    expected = {name: value / 1000 for name, value in changes.items() if name.endswith("_ms")}
    deadline = time.monotonic() + 5
    while any(
        abs(params[name.removesuffix("_ms")] - value) > 1e-9
        for params in await policy_seen_by_batchers(client)
        for name, value in expected.items()
    ):
        assert time.monotonic() < deadline, f"batchers did not apply {changes}"
        await asyncio.sleep(0.05)


@pytest.fixture
async def restore_policy(stack: EmbeddedStack, client: TaskClient) -> AsyncIterator[None]:
    """Put the defaults back after a test that tunes, so other tests see them."""
    yield
    s = stack.settings
    status, body = await tune(
        client, max_wait_ms=s.max_wait_ms, min_wait_ms=s.min_wait_ms, latency_target_ms=s.latency_target_ms,
        rate_halflife_ms=s.rate_halflife_ms,
        fill_slack=s.fill_slack, min_worthwhile_rows=s.min_worthwhile_rows, low_max_wait_ms=s.low_max_wait_ms,
    )
    assert status == 200, body
    deadline = time.monotonic() + 5
    while any(p["max_wait"] != s.max_wait_ms / 1000 for p in await policy_seen_by_batchers(client)):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
