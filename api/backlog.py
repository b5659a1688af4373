"""How far behind the batchers are, and how long a client should wait before retrying.

The backlog is the consumer lag of the requests topics (one a model): for each partition, the log end
(high watermark) less the batchers' committed offset. Both come from the batchers' status
board; the API also counts what it produced itself, so the backlog keeps growing, and
admission stops, even when no batcher is alive to report. The completion rate comes from
the shared counters of finished tasks.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from brimful.core import metrics
from brimful.core.stats import SharedStats, StatsField
from brimful.core.status_board import StatusBoard

log = logging.getLogger("brimful.api")


class BacklogMonitor:
    """Refreshed in the background; read on every POST without I/O."""

    def __init__(
        self, board: StatusBoard, stats: list[SharedStats], default_topic: str, interval_s: float = 0.5
    ) -> None:
        """``stats``: every served model's counters; ``default_topic``: the topic a status
        from a batcher that does not name its topic (an older release) is about."""
        self._board = board
        self._stats = stats
        self._default_topic = default_topic
        self._interval_s = interval_s
        # By (topic, partition): each model's batchers report their own topic's partitions.
        self._highwater: dict[tuple[str, int], int] = {}
        self._committed: dict[tuple[str, int], int] = {}
        self._produced: dict[tuple[str, int], int] = {}  # next offset after what this API produced
        self._finished: int | None = None
        self._finished_at = 0.0
        self.completion_rate = 0.0  # tasks finished per second, smoothed
        # Read on every POST, so kept up to date as it changes rather than summed per read.
        self._lag: dict[tuple[str, int], int] = {}
        self.backlog = 0

    def _update(self, partition: tuple[str, int]) -> None:
        end = max(self._highwater.get(partition, 0), self._produced.get(partition, 0))
        lag = max(0, end - max(self._committed.get(partition, 0), 0))
        self.backlog += lag - self._lag.get(partition, 0)
        self._lag[partition] = lag

    def retry_after_s(self, limit: int) -> int:
        """Seconds until the backlog should be back under ``limit`` at the measured rate."""
        excess = max(1, self.backlog - limit // 2)
        if self.completion_rate < 1.0:
            return 30  # nothing is draining: ask clients to stay away a while
        return int(min(120, max(1, math.ceil(excess / self.completion_rate))))

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
        for batcher in await self._board.read_all():
            topic = str(batcher.get("topic", self._default_topic))
            for number, state in batcher.get("partitions", {}).items():
                partition = (topic, int(number))
                self._highwater[partition] = max(self._highwater.get(partition, 0), int(state.get("highwater", 0)))
                if int(state.get("committed", -1)) >= 0:
                    self._committed[partition] = max(self._committed.get(partition, 0), int(state["committed"]))
                self._update(partition)
        metrics.BACKLOG_ROWS.set(self.backlog)
        finished = 0
        for counters in await asyncio.gather(*(stats.read() for stats in self._stats)):
            finished += counters[StatsField.TASKS_DONE] + counters[StatsField.TASKS_FAILED]
        now = time.monotonic()
        if self._finished is not None and now > self._finished_at:
            rate = max(0.0, (finished - self._finished) / (now - self._finished_at))
            self.completion_rate += 0.3 * (rate - self.completion_rate)
        self._finished, self._finished_at = finished, now
