"""One step of a process's shutdown, bounded in time and logged when it overruns.

A stop that waits on a broker or Redis gone quiet would otherwise hold the process past
its orchestrator's grace period and be killed with nothing said; bounded, each step
gives up on its own and says which one it was.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable

log = logging.getLogger("brimful.shutdown")

# How long closing one client may take at shutdown: a local socket or two.
CLOSE_S = 2.0
# A step that took longer than this is logged, so a slow stop can be traced to its step.
SLOW_STEP_S = 1.0


async def bounded_step(name: str, step: Awaitable[object], timeout_s: float) -> bool:
    """Run one shutdown step for at most ``timeout_s``; whether it finished. A step that
    fails or overruns is logged and abandoned (cancelled, not awaited: a step that ignored
    its cancellation must not hold the stop), never raised: the next steps still run."""
    task = asyncio.ensure_future(step)
    started = time.monotonic()
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    took_s = round(time.monotonic() - started, 3)
    if not done:
        task.cancel()
        log.warning("shutdown step overran; abandoned", extra={"step": name, "timeout_s": timeout_s})
        return False
    if task.cancelled():
        log.warning("shutdown step was cancelled", extra={"step": name, "took_s": took_s})
        return False
    error = task.exception()
    if error is not None:
        log.warning("shutdown step failed", extra={"step": name, "error": repr(error), "took_s": took_s})
        return False
    if took_s > SLOW_STEP_S:
        log.info("shutdown step was slow", extra={"step": name, "took_s": took_s})
    return True
