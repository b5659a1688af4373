"""The live flush policy, tuned through the API and waited for until every batcher applies it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tests.helpers.task_client import TaskClient


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
