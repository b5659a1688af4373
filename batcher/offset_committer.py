"""Commits each partition's finished offsets (``OffsetTracker.safe_to_commit``), so a
crash can only cause redelivery, never a skipped task.

The commits of batches that finish close together go as one (``commit_every_s``); an
offset is committed no sooner than ``commit_after_stored_s`` after its results were
stored (a Redis that syncs its log every second can lose that much to a kill, and the
records of what it lost must be read again); each commit is bounded in time, since a
broker that lost the topic can make it retry for ever."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from brimful.batcher.partition_state import PartitionState

log = logging.getLogger("brimful.batcher")


class Committing(Protocol):
    """What the committer needs of the Kafka consumer."""

    async def commit(self, offsets: dict[TopicPartition, Any]) -> None: ...


class OffsetCommitter:
    """Commits finished offsets when told there are some (``want``)."""

    def __init__(
        self,
        consumer: Committing,
        partitions: Callable[[], Mapping[int, PartitionState]],
        timeout_s: float,
        every_s: float,
        after_stored_s: float,
    ) -> None:
        """``partitions``: the partitions assigned now (a revoked one is never committed
        by a round that began before it was revoked)."""
        self._consumer = consumer
        self._partitions = partitions
        self._timeout_s = timeout_s
        self._every_s = every_s
        self._after_stored_s = after_stored_s
        self._wanted = asyncio.Event()

    def want(self) -> None:
        """Some offsets finished: commit them in the next round."""
        self._wanted.set()

    async def run(self) -> None:
        """Commit rounds until cancelled."""
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            states = list(self._partitions().values())
            finished = {state.tp: state.tracker.safe_to_commit for state in states if state.tracker is not None}
            if self._after_stored_s > 0:
                # What finished by now is durable in Redis once this passes; what finishes
                # meanwhile waits for the next round.
                await asyncio.sleep(self._after_stored_s)
            assigned = [state for state in states if self._partitions().get(state.tp.partition) is state]
            await self.commit(assigned, finished)
            await asyncio.sleep(self._every_s)  # the commits of batches finishing meanwhile go as one

    async def commit(self, states: list[PartitionState], upto: dict[TopicPartition, int] | None = None) -> None:
        """Commit each partition's finished offsets (``upto``: no further than these)."""
        offsets = {
            state.tp: OffsetAndMetadata(safe, "")
            for state in states
            if state.tracker is not None
            and (safe := min(state.tracker.safe_to_commit, (upto or {}).get(state.tp, state.tracker.safe_to_commit)))
            > state.committed
        }
        if not offsets:
            return
        try:
            async with asyncio.timeout(self._timeout_s):  # no task a commit, as wait_for makes
                await self._consumer.commit(offsets)
        except Exception as error:
            log.warning("offset commit failed; will retry", extra={"error": repr(error)})
            self._wanted.set()
            return
        for state in states:
            if state.tp in offsets:
                state.committed = offsets[state.tp].offset
