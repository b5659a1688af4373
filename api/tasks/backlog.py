"""How far behind each model's batchers are, and how long a client should wait before retrying.

A model's backlog is the consumer lag of its requests topic: for each partition, the log
end (high watermark) less the batchers' committed offset. Both come from the batchers'
status board; the API also counts what it produced itself, so the backlog keeps growing,
and admission stops, even when no batcher is alive to report. Admission is per model: one
model's backlog never refuses another's tasks. The completion rate comes from each model's
shared counters of finished tasks.

Reports only move a partition forward (a stale one, from a batcher that has just lost the
partition, moves nothing back), except when a partition's log end stays below the offset
already committed on it for ``RESTART_AFTER_S``: no live log does that, so its topic was
deleted and created again, and the partition starts over from what its batchers report.

With rotating topics (``core/topic_generations.py``) a model's backlog is the lag of
every generation of its topic together; a generation no batcher reports any more once it
may be retired is forgotten, so the figures stay bounded however long the API runs.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from brimful.core import metrics
from brimful.core.stats import SharedStats, StatsField
from brimful.core.status_board import StatusBoard
from brimful.core.topic_generations import TopicGenerations

log = logging.getLogger("brimful.api")

Partition = tuple[str, int]  # (topic, partition number)

# How long reports must put a partition's log end below its committed offset before the
# partition is taken to start over (a stale report leaves the board within seconds).
RESTART_AFTER_S = 10.0


class BacklogMonitor:
    """Refreshed in the background; read on every POST without I/O."""

    def __init__(
        self,
        board: StatusBoard,
        models: dict[str, tuple[str, SharedStats]],
        default_topic: str,
        interval_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        generations: dict[str, TopicGenerations] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``models``: each served model's topic -> (its name, its counters);
        ``default_topic``: the topic a status from a batcher that does not name its topic
        (an older release) is about; ``generations``: each model's topic -> its
        generations, where topics rotate."""
        self._board = board
        self._models = models
        self._default_topic = default_topic
        self._interval_s = interval_s
        self._clock = clock
        self._generations = generations or {}
        self._wall_clock = wall_clock
        self._base_of: dict[str, str] = {}  # a generation's topic -> its model's topic
        # By (topic, partition): each model's batchers report their own topic's partitions.
        self._highwater: dict[Partition, int] = {}
        self._committed: dict[Partition, int] = {}
        self._produced: dict[Partition, int] = {}  # next offset after what this API produced
        self._below_committed_since: dict[Partition, float] = {}  # reports put the log end below it
        self._finished: dict[str, int] = {}
        self._finished_at = 0.0
        self._rate: dict[str, float] = {}  # tasks finished per second by topic, smoothed
        # Read on every POST, so kept up to date as it changes rather than summed per read.
        self._lag: dict[Partition, int] = {}
        self._backlog: dict[str, int] = {}  # by topic

    @property
    def backlog(self) -> int:
        """Every model's backlog together."""
        return sum(self._backlog.values())

    def backlog_of(self, topic: str) -> int:
        """One model's backlog: the lag of its requests topic."""
        return self._backlog.get(topic, 0)

    @property
    def completion_rate(self) -> float:
        """Tasks finished per second, every model together (smoothed)."""
        return sum(self._rate.values())

    def _base(self, topic: str) -> str:
        """The model's topic a (generation's) topic belongs to."""
        base = self._base_of.get(topic)
        if base is None:
            base = topic
            for model_topic, generations in self._generations.items():
                if generations.generation_of(topic) is not None:
                    base = model_topic
            if len(self._base_of) < 10_000:  # bounded: names come from batchers' reports
                self._base_of[topic] = base
        return base

    def _update(self, partition: Partition) -> None:
        end = max(self._highwater.get(partition, 0), self._produced.get(partition, 0))
        lag = max(0, end - max(self._committed.get(partition, 0), 0))
        topic = self._base(partition[0])
        self._backlog[topic] = self._backlog.get(topic, 0) + lag - self._lag.get(partition, 0)
        self._lag[partition] = lag

    def _forget(self, partition: Partition) -> None:
        topic = self._base(partition[0])
        self._backlog[topic] = self._backlog.get(topic, 0) - self._lag.pop(partition, 0)
        for known in (self._highwater, self._committed, self._produced, self._below_committed_since):
            known.pop(partition, None)
        self._base_of.pop(partition[0], None)

    def _forget_retired(self, reported: set[Partition]) -> None:
        """Drop the partitions of generations that may be retired and that no batcher
        reports: their topic is deleted, or about to be."""
        now = self._wall_clock()
        for partition in [p for p in self._lag if p not in reported]:
            generations = self._generations.get(self._base(partition[0]))
            generation = generations.generation_of(partition[0]) if generations else None
            if (
                generations
                and generations.rotating
                and generation is not None
                and generations.may_retire(generation, now)
            ):
                self._forget(partition)

    def retry_after_s(self, topic: str, limit: int) -> int:
        """Seconds until the topic's backlog should be back under ``limit`` at the rate its
        model's tasks finish."""
        excess = max(1, self.backlog_of(topic) - limit // 2)
        rate = self._rate.get(topic, 0.0)
        if rate < 1.0:
            return 30  # nothing is draining: ask clients to stay away a while
        return int(min(120, max(1, math.ceil(excess / rate))))

    def produced(self, topic: str, number: int, offset: int) -> None:
        partition = (topic, number)
        self._produced[partition] = max(self._produced.get(partition, 0), offset + 1)
        self._update(partition)

    async def run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as error:
                log.warning("could not refresh the backlog", extra={"error": str(error)})
            await asyncio.sleep(self._interval_s)

    async def refresh(self) -> None:
        now = self._clock()
        reported: dict[Partition, tuple[int, int]] = {}  # this refresh's (highwater, committed), most ahead
        for batcher in await self._board.read_all():
            topic = str(batcher.get("topic", self._default_topic))
            for number, state in batcher.get("partitions", {}).items():
                partition = (topic, int(number))
                highwater, committed = int(state.get("highwater", 0)), int(state.get("committed", -1))
                seen = reported.get(partition, (0, -1))
                reported[partition] = (max(seen[0], highwater), max(seen[1], committed))
        for partition, (highwater, committed) in reported.items():
            if highwater < self._committed.get(partition, 0):
                since = self._below_committed_since.setdefault(partition, now)
                if now - since < RESTART_AFTER_S:
                    continue  # a stale report, most likely: it moves nothing back
                log.warning(
                    "a requests partition starts over (its topic was created again)",
                    extra={"topic": partition[0], "partition": partition[1]},
                )
                for known in (self._highwater, self._committed, self._produced, self._below_committed_since):
                    known.pop(partition, None)
            else:
                self._below_committed_since.pop(partition, None)
            self._highwater[partition] = max(self._highwater.get(partition, 0), highwater)
            if committed >= 0:
                self._committed[partition] = max(self._committed.get(partition, 0), committed)
            self._update(partition)
        self._forget_retired(set(reported))
        for topic, (model, _) in self._models.items():
            metrics.BACKLOG_ROWS.labels(model).set(self.backlog_of(topic))
        counters = await asyncio.gather(*(stats.read() for _, stats in self._models.values()))
        for topic, read in zip(self._models, counters):
            finished = read[StatsField.TASKS_DONE] + read[StatsField.TASKS_FAILED] + read[StatsField.TASKS_EXPIRED]
            if topic in self._finished and now > self._finished_at:
                rate = max(0.0, (finished - self._finished[topic]) / (now - self._finished_at))
                self._rate[topic] = self._rate.get(topic, 0.0) + 0.3 * (rate - self._rate.get(topic, 0.0))
            self._finished[topic] = finished
        self._finished_at = now
