"""Comparing a lane's answers with FastAPI's own routes: the cases sent to both and what
of each answer must match (``tests/integration/test_direct_lane.py``)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx

Lanes = tuple[httpx.AsyncClient, httpx.AsyncClient]  # (FastAPI's routes, the lane compared)
_TASK_ID = re.compile(r"[0-9a-f]{32}")
_COMPARED_HEADERS = ("content-type", "retry-after", "www-authenticate", "idempotent-replayed", "allow")


async def ready(client: httpx.AsyncClient, timeout_s: float = 30.0) -> None:
    """Until the API says it is ready (producer started, model signature read)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (answer := await client.get("/readyz")).status_code != 200:
        assert asyncio.get_running_loop().time() < deadline, f"API not ready: {answer.text}"
        await asyncio.sleep(0.05)


def comparable(answer: httpx.Response) -> tuple[int, Any, dict[str, str]]:
    """Status, body and the headers that matter, with what differs per task made equal."""
    try:
        body: Any = answer.json()
    except ValueError:
        body = answer.text
    if isinstance(body, dict):
        body = {k: ("<ms>" if k.endswith("_at_ms") else v) for k, v in body.items()}
        if isinstance(body.get("provenance"), dict):  # each task's own batch and stages: its shape compared
            provenance = body["provenance"]
            body["provenance"] = sorted(provenance) + sorted(provenance.get("stages_ms", {}))
    text = _TASK_ID.sub("<task id>", str(body))
    headers = {name: answer.headers[name] for name in _COMPARED_HEADERS if name in answer.headers}
    return answer.status_code, text, headers


async def both(lanes: Lanes, method: str, path: str, key: str | None, **kwargs: Any) -> tuple[Any, Any]:
    headers = dict(kwargs.pop("headers", {}))
    if key:
        headers["Authorization"] = f"Bearer {key}"
    plain, fast = lanes
    return (
        comparable(await plain.request(method, path, headers=headers, **kwargs)),
        comparable(await fast.request(method, path, headers=headers, **kwargs)),
    )


def submit_cases(keys: dict[str, str]) -> list[tuple[str, str, str | None, dict[str, Any]]]:
    # Each its own model call: the second lane's answer would otherwise say "cached".
    good = {"json": {"inputs": {"TEXT": "a lane"}, "cache": False}}
    return [
        ("done inline", "/v1/tasks?wait=10", keys["submit"], good),
        ("accepted", "/v1/tasks", keys["submit"], good),
        ("no key", "/v1/tasks", None, good),
        ("unknown key", "/v1/tasks", "bf_not-a-key", good),
        ("key without the submit scope", "/v1/tasks", keys["read"], good),
        ("invalid JSON", "/v1/tasks", keys["submit"], {"content": b'{"inputs": '}),
        ("not UTF-8", "/v1/tasks", keys["submit"], {"content": b'{"inputs": {"TEXT": "\xff"}}'}),
        ("unknown input", "/v1/tasks", keys["submit"], {"json": {"inputs": {"IMAGE": "x"}}}),
        ("unknown field", "/v1/tasks", keys["submit"], {"json": {"inputs": {"TEXT": "x"}, "extra": 1}}),
        ("wrong type", "/v1/tasks", keys["submit"], {"json": {"inputs": {"TEXT": 7}}}),
        ("bad deadline", "/v1/tasks", keys["submit"], {"json": {"inputs": {"TEXT": "x"}, "deadline_ms": 0}}),
        ("bad priority", "/v1/tasks", keys["submit"], {"json": {"inputs": {"TEXT": "x"}, "priority": "urgent"}}),
        ("bad cache", "/v1/tasks", keys["submit"], {"json": {"inputs": {"TEXT": "x"}, "cache": 1}}),
        ("unknown model", "/v1/tasks", keys["submit"], {"json": {"inputs": {"TEXT": "x"}, "model": "nope"}}),
        ("bad wait", "/v1/tasks?wait=soon", keys["submit"], good),
        ("wait too long", "/v1/tasks?wait=100000", keys["submit"], good),
        ("body too large", "/v1/tasks", keys["submit"], {"content": b"x" * 2_000_000}),
        ("bad Idempotency-Key", "/v1/tasks", keys["submit"], {**good, "headers": {"Idempotency-Key": "a b"}}),
    ]
