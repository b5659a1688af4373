"""A small HTTP client for the tests: submit, read, and wait for tasks (aiohttp, so a
burst from the tests really arrives as a burst)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from brimful.api.main import KEEP_ALIVE_S

FINAL = ("done", "failed")


class TaskClient:
    def __init__(self, base_url: str, connections: int = 100) -> None:
        self._base_url = base_url
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> TaskClient:
        # Idle connections are dropped well before the API closes them: one reused just as the
        # server closes it fails the request with "server disconnected".
        connector = aiohttp.TCPConnector(limit=self._connections, keepalive_timeout=KEEP_ALIVE_S / 2)
        self._session = aiohttp.ClientSession(self._base_url, connector=connector)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._session is not None
        await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None
        return self._session

    async def request(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        async with self.session.request(method, path, **kwargs) as response:
            body = await response.json(content_type=None)
            return response.status, body

    async def submit(self, inputs: dict[str, Any]) -> str:
        status, body = await self.request("POST", "/v1/tasks", json={"inputs": inputs})
        assert status == 202, body
        return str(body["task_id"])

    async def get(self, task_id: str) -> dict[str, Any]:
        status, body = await self.request("GET", f"/v1/tasks/{task_id}")
        assert status == 200, body
        return dict(body)

    async def stats(self) -> dict[str, Any]:
        status, body = await self.request("GET", "/v1/stats")
        assert status == 200, body
        return dict(body)

    async def wait_final(self, task_id: str, timeout_s: float = 30.0, interval_s: float = 0.02) -> dict[str, Any]:
        """Poll until the task is done or failed; fail the test after ``timeout_s``.
        A 503 (a backing service restarting) is retried, as a client would."""
        deadline = time.monotonic() + timeout_s
        status = "unknown"
        while True:
            code, body = await self.request("GET", f"/v1/tasks/{task_id}")
            if code == 200:
                status = body["status"]
                if status in FINAL:
                    return dict(body)
            else:
                assert code == 503, body
            if time.monotonic() > deadline:
                raise AssertionError(f"task {task_id} still {status} after {timeout_s} s")
            await asyncio.sleep(interval_s)
