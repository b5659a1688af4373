"""When the embedded stack starts a dead child again: pure, on a virtual clock."""

from __future__ import annotations

from brimful.stack import RestartBackoff, Supervisor


def test_the_wait_doubles_while_a_child_keeps_dying_and_is_capped() -> None:
    backoff = RestartBackoff(first_s=0.5, max_s=4.0, stable_s=60.0)
    backoff.started("batcher-0", now=0.0)
    waits = []
    now = 1.0
    for _ in range(6):
        waits.append(backoff.delay("batcher-0", now))
        now += waits[-1]
        backoff.started("batcher-0", now)
        now += 1.0  # dies a second after each start
    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_a_child_that_stayed_up_long_enough_starts_over() -> None:
    backoff = RestartBackoff(first_s=0.5, max_s=30.0, stable_s=60.0)
    backoff.started("api", now=0.0)
    assert backoff.delay("api", now=1.0) == 0.5
    backoff.started("api", now=1.5)
    assert backoff.delay("api", now=2.0) == 1.0
    backoff.started("api", now=3.0)
    assert backoff.delay("api", now=100.0) == 0.5  # up for 97 s: a fresh failure
    assert backoff.delay("redis", now=100.0) == 0.5  # children are counted apart


class _Child:
    def __init__(self, running: bool) -> None:
        self._running = running
        self.returncode = None if running else 1

    def running(self) -> bool:
        return self._running


class _Stack:
    """What the supervisor asks of a stack: its children, and starting one again, which
    fails the first ``failures`` times as a start that meets a paused Redis would."""

    def __init__(self, failures: int) -> None:
        self.processes = {"redis": _Child(True), "batcher-0": _Child(False), "api": _Child(True)}
        self.failures = failures
        self.restarted: list[str] = []

    def process_names(self) -> list[str]:
        return list(self.processes)

    def component_running(self, name: str) -> bool:
        return self.processes[name].running()

    def exit_status(self, name: str) -> str:
        return f"status {self.processes[name].returncode}"

    def restart(self, name: str) -> None:
        if self.failures:
            self.failures -= 1
            raise TimeoutError("timed out")
        self.restarted.append(name)
        self.processes[name] = _Child(True)


def test_a_child_whose_start_fails_with_any_error_is_tried_again_and_the_rest_carries_on() -> None:
    now = [0.0]
    said: list[str] = []
    stack = _Stack(failures=2)
    supervisor = Supervisor(stack, RestartBackoff(first_s=1.0, max_s=8.0), clock=lambda: now[0], say=said.append)  # type: ignore[arg-type]
    for _ in range(20):
        supervisor.check()  # never raises
        now[0] += 1.0
    assert stack.restarted == ["batcher-0"]  # once, after two failed starts; the others never stopped
    assert sum("did not start again (timed out)" in line for line in said) == 2
