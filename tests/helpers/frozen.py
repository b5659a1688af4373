"""Freezing a server process in a test: SIGSTOP, then wait until the kernel reports every
thread of it stopped, so that nothing sent after the freeze can still be answered."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

from tests.helpers.polling import wait_for


def thread_states(pid: int) -> list[str]:
    """The state letter of each thread of ``pid`` (``T`` or ``t`` when stopped)."""
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            # The command name in parentheses may hold spaces; the state follows it.
            states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
    return states


def all_stopped(pid: int) -> bool:
    states = thread_states(pid)
    return bool(states) and all(state in ("T", "t") for state in states)


@contextlib.asynccontextmanager
async def frozen(pid: int, timeout_s: float = 10.0) -> AsyncIterator[None]:
    """``pid`` stopped, every thread of it, for the body; continued after it, whatever
    happens."""
    os.kill(pid, signal.SIGSTOP)
    try:
        await wait_for(lambda: all_stopped(pid), timeout_s, f"every thread of {pid} to stop", interval_s=0.01)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
