"""The fast lane answers every request to the two hot routes exactly as FastAPI's own
routes do: the same status, body and headers, for good requests and bad ones, with
auth on; and leaves every other request to FastAPI.

Both lanes run in this process over one API state, on the session's real broker, Redis
and Triton: requests go through the fast lane and through the bare FastAPI app side by
side.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from brimful.api.app import create_app
from brimful.api.http.browser_guard import BrowserGuard
from brimful.api.http.fast_lane import FastLane
from brimful.api.http.response_metrics import ResponseCounter
from brimful.api.state import ApiState
from brimful.core.api_keys import ApiKeys, Scope
from brimful.core.redis_keys import RedisKeys
from brimful.stack import EmbeddedStack

Lanes = tuple[httpx.AsyncClient, httpx.AsyncClient]  # (FastAPI's routes, the fast lane)
_TASK_ID = re.compile(r"[0-9a-f]{32}")
_COMPARED_HEADERS = ("content-type", "retry-after", "www-authenticate", "idempotent-replayed", "allow")


@pytest.fixture
async def lanes(stack: EmbeddedStack) -> AsyncIterator[tuple[Lanes, dict[str, str]]]:
    """Both lanes over one state with auth on; yields them and API keys by scope."""
    settings = stack.settings.model_copy(update={"auth_enabled": True, "api_fast_lane": False})
    counted = create_app(settings)
    assert isinstance(counted, ResponseCounter) and isinstance(counted.app, BrowserGuard)
    app = counted.app.app
    assert isinstance(app, FastAPI)
    lane = FastLane(app)
    async with app.router.lifespan_context(app):
        state: ApiState = app.state.brimful
        issuer = ApiKeys(state.redis, RedisKeys(settings.key_prefix))  # as `brimful keys create` makes them
        keys = {
            "submit": (await issuer.create("lane-test", [Scope.SUBMIT, Scope.READ]))[0],
            "read": (await issuer.create("lane-test", [Scope.READ]))[0],
        }
        async with (
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api", timeout=30) as plain,
            httpx.AsyncClient(transport=httpx.ASGITransport(app=lane), base_url="http://api", timeout=30) as fast,
        ):
            await ready(plain)
            yield (plain, fast), keys


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
    good = {"json": {"inputs": {"TEXT": "fast lane"}, "cache": False}}
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


async def test_submissions_are_answered_alike_in_both_lanes(lanes: tuple[Lanes, dict[str, str]]) -> None:
    clients, keys = lanes
    for name, path, key, kwargs in submit_cases(keys):
        plain, fast = await both(clients, "POST", path, key, **kwargs)
        assert fast == plain, name
        if name == "done inline":  # what follows compares real answers, not two refusals
            assert plain[0] == 200 and "SHA256" in plain[1], plain


async def test_idempotent_replays_are_answered_alike(lanes: tuple[Lanes, dict[str, str]]) -> None:
    clients, keys = lanes
    for lane, client in zip(("plain", "fast"), clients):  # one key per lane: each replays its own task
        headers = {"Authorization": f"Bearer {keys['submit']}", "Idempotency-Key": f"lane-{lane}"}
        first = await client.post("/v1/tasks?wait=10", json={"inputs": {"TEXT": "once"}}, headers=headers)
        replay = await client.post("/v1/tasks", json={"inputs": {"TEXT": "once"}}, headers=headers)
        assert first.status_code == 200 and replay.status_code == 200, (first.text, replay.text)
        assert replay.headers["idempotent-replayed"] == "true"
        assert replay.json()["task_id"] == first.json()["task_id"]


async def test_reads_are_answered_alike_in_both_lanes(lanes: tuple[Lanes, dict[str, str]]) -> None:
    clients, keys = lanes
    done = await clients[0].post(
        "/v1/tasks?wait=10", json={"inputs": {"TEXT": "read me"}}, headers={"Authorization": f"Bearer {keys['submit']}"}
    )
    assert done.status_code == 200, done.text
    task_id = done.json()["task_id"]
    cases = [
        ("done", f"/v1/tasks/{task_id}", keys["read"]),
        ("done, long-poll", f"/v1/tasks/{task_id}?wait=5", keys["read"]),
        ("no key", f"/v1/tasks/{task_id}", None),
        ("unknown task", f"/v1/tasks/{'0' * 32}", keys["read"]),
        ("malformed id", "/v1/tasks/not-an-id", keys["read"]),
        ("bad wait", f"/v1/tasks/{task_id}?wait=-1", keys["read"]),
        ("trailing slash: FastAPI's", "/v1/tasks/", keys["read"]),
        ("deeper path: FastAPI's", f"/v1/tasks/{task_id}/more", keys["read"]),
    ]
    for name, path, key in cases:
        plain, fast = await both(clients, "GET", path, key)
        assert fast == plain, name
    done_plain, _ = await both(clients, "GET", f"/v1/tasks/{task_id}", keys["read"])
    assert done_plain[0] == 200 and "SHA256" in done_plain[1]  # the comparison above compared real answers


async def test_other_methods_and_routes_go_to_fastapi(lanes: tuple[Lanes, dict[str, str]]) -> None:
    clients, keys = lanes
    for method, path in (
        ("PUT", "/v1/tasks"),
        ("GET", "/v1/tasks"),
        ("PATCH", f"/v1/tasks/{'0' * 32}"),
        ("GET", "/no/such/route"),
    ):
        plain, fast = await both(clients, method, path, keys["submit"])
        assert fast == plain, (method, path)
    # Live figures (rates decaying, lag) change between two reads: the same route answered
    # both when the answers have the same status and fields.
    headers = {"Authorization": f"Bearer {keys['submit']}"}
    plain_stats = await clients[0].get("/v1/stats", headers=headers)
    fast_stats = await clients[1].get("/v1/stats", headers=headers)
    assert (fast_stats.status_code, sorted(fast_stats.json())) == (plain_stats.status_code, sorted(plain_stats.json()))
    assert (await clients[1].put("/v1/tasks")).status_code == 405
    # A path that merely starts like the fast one is FastAPI's.
    plain, fast = await both(
        clients, "POST", "/v1/tasks:batch", keys["submit"], json={"tasks": [{"inputs": {"TEXT": "x"}}]}
    )
    assert fast == plain and fast[0] == 200 and "accepted" in fast[1], fast
