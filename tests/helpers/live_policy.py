"""The live flush policy, tuned through the API and waited for until every batcher applies it."""

from __future__ import annotations

from typing import Any

from tests.helpers.polling import wait_for
from tests.helpers.task_client import TaskClient


async def policy_seen_by_batchers(client: TaskClient) -> list[dict[str, Any]]:
    """The live policy of each batcher on the status board; waits (up to 10 s) while the
    board is empty, so "every batcher applies it" is never true of none."""
    batchers: list[dict[str, Any]] = []

    async def listed() -> bool:
        batchers[:] = (await client.stats())["batchers"]
        return bool(batchers)

    await wait_for(listed, 10, "a batcher on the status board", interval_s=0.05)
    return [batcher["params"] for batcher in batchers]


async def tune(client: TaskClient, **changes: float) -> tuple[int, Any]:
    return await client.request("PATCH", "/v1/admin/policy", json=changes)


async def tune_live(client: TaskClient, **changes: float) -> None:
    """Change the live policy and wait (up to 5 s) until every batcher applies it."""
    status, body = await tune(client, **changes)
    assert status == 200, body
    expected = {name: value / 1000 for name, value in changes.items() if name.endswith("_ms")}
    await wait_for(lambda: applied(client, expected), 5, f"the batchers to apply {changes}", interval_s=0.05)


async def applied(client: TaskClient, expected: dict[str, float]) -> bool:
    """Whether every batcher applies these parameters (seconds, by name)."""
    return all(
        abs(params[name.removesuffix("_ms")] - value) <= 1e-9
        for params in await policy_seen_by_batchers(client)
        for name, value in expected.items()
    )
