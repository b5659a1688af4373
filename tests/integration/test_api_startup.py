"""A request that reaches an API process while it is still starting (the model's signature
not read yet, the producer not up) waits for it, bounded, instead of answering 503: with
several API workers behind one port, /readyz may come from a worker that is ready while
the next request lands on one that is not.

The API runs in this process, on the session's real broker, Redis and Triton.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest
from fastapi import FastAPI

from brimful.api.app import create_app
from brimful.api.http.guards import BrowserGuard
from brimful.api.http.response_metrics import ResponseCounter
from brimful.api.state import ApiState
from brimful.stack import EmbeddedStack
from brimful.stack.processes import free_port

AppFactory = Callable[..., FastAPI]


@pytest.fixture
def app_for(stack: EmbeddedStack) -> AppFactory:
    """A new API app on the session stack's settings, with overrides; not started."""

    def make(**overrides: object) -> FastAPI:
        counted = create_app(stack.settings.model_copy(update={**overrides}))
        assert isinstance(counted, ResponseCounter) and isinstance(counted.app, BrowserGuard)
        assert isinstance(counted.app.app, FastAPI)
        return counted.app.app

    return make


async def test_a_task_posted_while_the_api_is_still_starting_is_accepted_and_completes(app_for: AppFactory) -> None:
    app = app_for()
    async with app.router.lifespan_context(app):
        state: ApiState = app.state.brimful
        assert not state.serving, "the API was ready before its first request: this test shows nothing"
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api", timeout=30) as http:
            answer = await http.post("/v1/tasks", json={"inputs": {"TEXT": "posted during start"}})
            assert answer.status_code == 202, answer.text
            task_id = answer.json()["task_id"]
            final = await http.get(f"/v1/tasks/{task_id}", params={"wait": 20})
            assert final.status_code == 200, final.text
            assert final.json()["status"] == "done", final.text


async def test_a_task_posted_to_an_api_whose_model_never_answers_gets_503_model_not_ready(app_for: AppFactory) -> None:
    app = app_for(triton_url=f"127.0.0.1:{free_port()}")  # nothing listens there
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api", timeout=30) as http:
            answer = await asyncio.wait_for(http.post("/v1/tasks", json={"inputs": {"TEXT": "no model"}}), timeout=20)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "model_not_ready"
    assert answer.headers["retry-after"] == "1"
