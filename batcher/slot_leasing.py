"""Slots leased before their rows leave the accumulator, where batchers share endpoints.

A batch that is due takes a slot from this batcher's view of the pool, but other batchers
may hold the endpoint's every slot: the lease in Redis says. Leased first, a refused batch
keeps filling in its accumulator (rows arriving meanwhile join it) and tries again when the
endpoint is next counted free; leased after its rows were taken, it waited outside the
accumulator with what it had (two batchers on one endpoint: 45 rows a call against 63.7
for one, bench/results/scale.md). One lease at a time a partition.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from brimful.batcher.policy import FlushReason
from brimful.workers.model_pool import ModelPool
from brimful.workers.slot import Slot

log = logging.getLogger("brimful.batcher")


class SlotLeasing:
    """Lease attempts under way, and leased slots waiting for the loop, by partition."""

    def __init__(self, pool: ModelPool, wake: Callable[[], None]) -> None:
        self._pool = pool
        self._wake = wake
        self._pending: dict[int, tuple[asyncio.Task[None], Slot]] = {}
        self._ready: dict[int, tuple[Slot, FlushReason]] = {}

    def pending(self, partition: int) -> bool:
        """Whether a lease for ``partition`` is on its way (its batch keeps filling)."""
        return partition in self._pending

    def start(self, partition: int, slot: Slot, reason: FlushReason) -> None:
        """Lease ``slot`` for ``partition``'s batch, due for ``reason``; the loop is woken
        when it is settled."""
        task = asyncio.create_task(self._lease(partition, slot, reason), name="brimful-lease")
        self._pending[partition] = (task, slot)

    async def _lease(self, partition: int, slot: Slot, reason: FlushReason) -> None:
        try:
            leased = await self._pool.try_lease(slot)
        except asyncio.CancelledError:
            raise  # dropped: try_lease gave the slot back
        except Exception as error:  # Redis failing: the batch goes, and its call secures the slot as before
            log.warning("could not lease a slot", extra={"partition": partition, "error": repr(error)})
            leased = True
        if leased:
            self._ready[partition] = (slot, reason)
        self._pending.pop(partition, None)
        self._wake()

    def take_ready(self, partition: int) -> tuple[Slot, FlushReason] | None:
        """A slot leased for ``partition``'s batch, with why the batch was due."""
        return self._ready.pop(partition, None)

    def drop(self, partition: int) -> None:
        """Give back what ``partition`` holds or is leasing (revoked, stopping, or no rows
        left to send)."""
        pending = self._pending.pop(partition, None)
        if pending is not None:
            pending[0].cancel()
            self._pool.abandon(pending[1])  # a task cancelled before it ran never gives it back
        ready = self._ready.pop(partition, None)
        if ready is not None:
            self._pool.release(ready[0])

    def drop_all(self) -> None:
        for partition in {*self._pending, *self._ready}:
            self.drop(partition)

    def idle_ready(self, partitions_with_rows: set[int]) -> None:
        """Give back leased slots whose partition has no rows left (cancelled meanwhile)."""
        for partition in [p for p in self._ready if p not in partitions_with_rows]:
            self.drop(partition)
