"""Keeping the embedded stack up: a child that dies is started again, after a wait that
grows while it keeps dying, and the rest of the stack carries on meanwhile."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from brimful.stack.embedded import EmbeddedStack

log = logging.getLogger("brimful.stack")


@dataclass
class RestartBackoff:
    """How long to wait before starting a dead child again: ``first_s`` after its first
    death, doubling with each death that follows a short run, at most ``max_s``; a child
    that stayed up ``stable_s`` starts over. Pure: the caller says what time it is."""

    first_s: float = 0.5
    max_s: float = 30.0
    stable_s: float = 60.0
    _deaths: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    _started_at: dict[str, float] = field(default_factory=dict)

    def started(self, name: str, now: float) -> None:
        self._started_at[name] = now

    def delay(self, name: str, now: float) -> float:
        """Seconds until ``name``, dead at ``now``, may be started again."""
        if now - self._started_at.get(name, now) >= self.stable_s:
            self._deaths[name] = 0
        self._deaths[name] += 1
        return min(self.max_s, self.first_s * 2.0 ** (self._deaths[name] - 1))


class Supervisor:
    """Watches the stack's children; ``check()`` restarts those due (call it every second
    or so), and never raises: a child that fails to start is tried again later. Only
    ``EmbeddedStack.stop()`` ends the stack."""

    def __init__(
        self,
        stack: EmbeddedStack,
        backoff: RestartBackoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] = log.warning,
    ) -> None:
        self._stack = stack
        self._backoff = backoff or RestartBackoff()
        self._clock = clock
        self._say = say
        self._due: dict[str, float] = {}  # dead child -> when it may start again
        for name in stack.process_names():
            self._backoff.started(name, clock())

    def check(self) -> None:
        now = self._clock()
        for name in self._stack.process_names():
            if name not in self._due and not self._stack.component_running(name):
                wait = self._backoff.delay(name, now)
                self._due[name] = now + wait
                self._say(f"{name} exited ({self._stack.exit_status(name)}); starting it again in {wait:.1f} s")
        for name, at in list(self._due.items()):
            if now < at:
                continue
            try:
                self._stack.restart(name)
            except Exception as error:
                wait = self._backoff.delay(name, self._clock())
                self._due[name] = self._clock() + wait
                self._say(f"{name} did not start again ({error}); next try in {wait:.1f} s")
                continue
            del self._due[name]
            self._backoff.started(name, self._clock())
            self._say(f"{name} started again")
