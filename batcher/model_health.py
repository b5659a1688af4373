"""Following the model's health from the batcher: consumption pauses while every endpoint's
circuit is open, so an outage costs neither retries nor dead letters, and resumes by itself
once one closes; and endpoints out of service are probed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from aiokafka import AIOKafkaConsumer

from brimful.batcher.partition_state import PartitionState
from brimful.workers.model_pool import ModelPool

log = logging.getLogger("brimful.batcher")


class ModelHealth:
    """Pauses and resumes the partitions with the model's health, and probes endpoints."""

    def __init__(
        self,
        pool: ModelPool,
        consumer: AIOKafkaConsumer,
        partitions: Mapping[int, PartitionState],
        wake: Callable[[], None],
    ) -> None:
        self._pool = pool
        self._consumer = consumer
        self._partitions = partitions
        self._wake = wake
        self.paused = False  # every partition paused while the model is unreachable
        self._probe: asyncio.Task[None] | None = None

    @property
    def watching(self) -> bool:
        """Whether some circuit is open: the loop looks again often, to see it close."""
        return self.paused or self._pool.some_circuit_open

    def follow(self, batches_in_flight: int) -> None:
        """Look at the model's health now (each turn of the loop)."""
        pool = self._pool
        healthy = pool.healthy
        # No batch is calling the model to find out when it is back, or an endpoint out of a
        # pool that still serves gets no batches (they go to the others): the batcher asks
        # it itself, whenever its breaker would let a probe through.
        wanted = healthy or batches_in_flight == 0
        if wanted and pool.probe_due and (self._probe is None or self._probe.done()):
            self._probe = asyncio.create_task(pool.probe(), name="brimful-probe")
            self._probe.add_done_callback(lambda _: self._wake())
        if not healthy and not self.paused:
            self.paused = True
            self._consumer.pause(*[state.tp for state in self._partitions.values()])
            log.warning("model unreachable: consumption paused", extra={"partitions": sorted(self._partitions)})
        elif healthy and self.paused:
            self.paused = False
            self._consumer.resume(*[state.tp for state in self._partitions.values() if not state.paused])
            log.info("model reachable again: consumption resumed", extra={"partitions": sorted(self._partitions)})

    def endpoint_down(self, url: str) -> None:
        """News that another batcher opened ``url``'s circuit: open it here too, and wake
        the loop, which probes it while it is open (asleep with nothing to do, it would not
        look until the next record arrived)."""
        if self._pool.trip(url):
            self._wake()

    def slots_stalled_s(self, now: float) -> float:
        """How long rows have waited here while no model slot was taken or given back (0
        when none waits, or while the model is out: an outage is not a stall). Calls are
        bounded by their timeout, so slots that stand still while rows wait are wedged."""
        arrivals = [s.accumulator.oldest_arrival for s in self._partitions.values()]
        waiting = [arrived for arrived in arrivals if arrived is not None]
        if not waiting or not self._pool.healthy:
            return 0.0
        return max(0.0, now - max(min(waiting), self._pool.moved_at))
