"""The broker's answers for recorded tasks, written back to Redis; and the sweep of tasks
whose API stopped before it heard one.

Admission puts every task it records in the set of unconfirmed tasks
(``core/unconfirmed_tasks.py``). Once the broker has answered for a task, accepted or
refused, its entry goes. The accepted ones are taken out in bulk about once a second
(``CONFIRM_EVERY_S``), so confirming costs no round trip a group: one a second,
whatever the load. The refused ones go as they are taken back.

Every API also sweeps the set: an entry older than the longest a submission can take,
plus the confirmation's delay, was left by an API that stopped between recording a task
and confirming it (killed, or its node lost), or its confirmation was lost (a Redis that
lost its last second). Its task is taken out of its tenant's in-flight count, so a crash
costs the tenant no quota; a task that was accepted only leaves the count early.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable

from redis.exceptions import RedisError

from brimful.core import metrics
from brimful.core.settings import Settings
from brimful.core.unconfirmed_tasks import COMMAND_MEMBERS, UnconfirmedTasks, unconfirmed_member

log = logging.getLogger("brimful.api")

# How often accepted tasks' entries are taken out of the set: a round trip a second.
CONFIRM_EVERY_S = 1.0
# Confirmations kept while Redis cannot take them: past this, the oldest are dropped, and
# the sweep later takes their tasks out of the in-flight count (early, a small undercount).
MAX_PENDING = 100_000
# A sweep every this share of the time an entry takes to turn stale.
SWEEP_EVERY_SHARE = 0.5
# Most calls one sweep makes (COMMAND_MEMBERS entries each): the rest wait for the next.
SWEEP_MAX_CALLS = 10
# Task ids a sweep's log line names at most.
LOGGED_IDS = 20


def longest_submission_s(settings: Settings) -> float:
    """Longer than any submission can take from its record in Redis to its answer: the
    broker's timeout and Redis's pool wait, twice, and 5 s."""
    return 2 * (settings.kafka_request_timeout_ms / 1000 + settings.redis_pool_timeout_s) + 5


def stale_after_s(longest_s: float) -> float:
    """An entry older than this is stale: its API would have confirmed it by now (the
    longest submission, ``longest_s``, and the confirmation's delay)."""
    return longest_s + 2 * CONFIRM_EVERY_S


def released_within_s(settings: Settings) -> float:
    """At most how long after its record a task left unconfirmed leaves its tenant's
    in-flight count: stale, then swept within a sweep's period."""
    return stale_after_s(longest_submission_s(settings)) * (1 + SWEEP_EVERY_SHARE)


class SubmissionReceipts:
    """Confirms accepted tasks in bulk, and sweeps those no API will confirm."""

    def __init__(
        self,
        unconfirmed: UnconfirmedTasks,
        longest_submission_s: float,
        wall_s: Callable[[], float] = time.time,
    ) -> None:
        self._unconfirmed = unconfirmed
        self.stale_after_s = stale_after_s(longest_submission_s)
        self.sweep_every_s = SWEEP_EVERY_SHARE * self.stale_after_s
        self._wall_s = wall_s
        self._pending: deque[str] = deque(maxlen=MAX_PENDING)

    def confirmed(self, tasks: Iterable[tuple[str, str]]) -> None:
        """(task id, tenant) of tasks the broker accepted: their entries go at the next flush."""
        self._pending.extend(unconfirmed_member(task_id, tenant) for task_id, tenant in tasks)

    @property
    def pending(self) -> int:
        """Confirmations not yet written."""
        return len(self._pending)

    async def flush(self) -> None:
        """Write the confirmations noted so far; kept for the next flush if Redis fails."""
        if not self._pending:
            return
        members = list(self._pending)
        self._pending.clear()
        try:
            await self._unconfirmed.confirm(members)
        except RedisError as error:
            log.warning("could not confirm submissions; will retry", extra={"tasks": len(members), "error": str(error)})
            self._pending.extendleft(reversed(members))

    async def sweep(self) -> list[tuple[str, str]]:
        """Release the stale entries' tasks from their tenants' in-flight counts; returns
        their (task id, tenant)."""
        cutoff_ms = int(1000 * (self._wall_s() - self.stale_after_s))
        released: list[tuple[str, str]] = []
        for _ in range(SWEEP_MAX_CALLS):
            tasks = await self._unconfirmed.release_stale(cutoff_ms)
            released += tasks
            if len(tasks) < COMMAND_MEMBERS:
                break
        if released:
            metrics.UNCONFIRMED_RELEASED.inc(len(released))
            log.warning(
                "released tasks never confirmed from the in-flight count (an API stopped before it confirmed "
                "them, or Redis lost the confirmation); each runs if its record reached the broker",
                extra={"tasks": len(released), "task_ids": [task_id for task_id, _ in released[:LOGGED_IDS]]},
            )
        return released

    async def run(self) -> None:
        """Flush every CONFIRM_EVERY_S and sweep every ``sweep_every_s``, until cancelled."""
        next_sweep = time.monotonic()  # at once: what a stop long past left is stale already
        while True:
            await self.flush()
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + self.sweep_every_s
                try:
                    await self.sweep()
                except RedisError as error:
                    log.warning("could not sweep unconfirmed submissions", extra={"error": str(error)})
            await asyncio.sleep(CONFIRM_EVERY_S)
