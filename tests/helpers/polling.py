"""Waiting in a test for something that happens in the background: a poll with a deadline."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


async def wait_for(
    predicate: Callable[[], bool | Awaitable[bool]], timeout_s: float, what: str, interval_s: float = 0.1
) -> None:
    """Until ``predicate()`` (plain or awaitable) holds; fails the test naming ``what``
    after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        held = predicate()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(interval_s)
