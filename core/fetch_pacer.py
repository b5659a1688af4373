"""Fitting a live consumer's fetch wait to what its fetches bring (``fetch_wait``)."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord

from brimful.core import metrics
from brimful.core.fetch_wait import FetchWait

log = logging.getLogger("brimful.kafka")

_POSITION_TIMEOUT_S = 0.5  # a partition whose position is being reset counts as not lagging


def set_fetch_max_wait(consumer: AIOKafkaConsumer, wait_ms: int) -> bool | None:
    """Change the wait of ``consumer``'s next fetch requests. aiokafka fixes it at
    construction and has no setter, so this sets its fetcher's attribute; False (and the
    wait unchanged) should a release rename it, None before the consumer has started (it
    has no fetcher yet). tests/faults/test_fetch_pacer.py pins it."""
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None:
        return None
    if not isinstance(getattr(fetcher, "_fetch_max_wait_ms", None), int):
        return False
    fetcher._fetch_max_wait_ms = wait_ms
    return True


class FetchPacer:
    """After each fetch, lengthens or resets the consumer's fetch wait (see ``fetch_wait``)."""

    def __init__(self, consumer: AIOKafkaConsumer, base_ms: int, ceiling_ms: int, name: str) -> None:
        self._consumer = consumer
        self._wait = FetchWait(base_ms, ceiling_ms)
        self._name = name  # which consumer, in logs and metrics
        self._unsupported = False
        # A wait set before the consumer started, applied after its first fetch. A topic
        # generation is paced as it is joined, before its consumer starts: taken for
        # "unsupported", that wait was dropped, and every generation joined ahead of its
        # start fetched at the live wait all its life (four at a time in an idle batcher).
        self._pending = False

    @property
    def wait_ms(self) -> int:
        """The wait the consumer's fetches ask for now."""
        return self._wait.current_ms

    def set_base(self, base_ms: int) -> bool:
        """Make ``base_ms`` the wait while caught up (``FetchWait.rebase``), the consumer's
        next fetches taking it at once where it applies; False where this aiokafka release's
        wait cannot be changed. The pacer is the wait's one owner: a wait set beside it would
        be undone the next time it drops back to its base."""
        before = self._wait.current_ms
        wait_ms = self._wait.rebase(base_ms)
        if wait_ms == before and not self._pending:
            return not self._unsupported
        return self._apply(wait_ms)

    def _apply(self, wait_ms: int) -> bool:
        """Give the consumer's fetcher ``wait_ms``: at once, or after its first fetch where
        it has not started; False where this release's wait cannot be changed."""
        if self._unsupported:
            return False
        applied = set_fetch_max_wait(self._consumer, wait_ms)
        self._pending = applied is None
        if applied is False:
            self._unsupported = True
        return applied is not False

    async def after_fetch(self, fetched: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        """Account for one ``getmany`` result. Cheap on the busy path: lag is only read
        when the fetch came back empty or the wait is raised."""
        if self._pending:  # started since a wait was set
            self._apply(self._wait.current_ms)
        got_records = any(fetched.values())
        if got_records and self._wait.current_ms == self._wait.base_ms:
            return
        before = self._wait.current_ms
        wait_ms = self._wait.after_fetch(got_records, await self._lagging())
        if wait_ms == before or self._unsupported:
            return
        if not self._apply(wait_ms):
            log.warning(
                "cannot change the fetch wait of this aiokafka release; it stays fixed", extra={"consumer": self._name}
            )
            return
        metrics.FETCH_WAIT.labels(self._name).set(wait_ms / 1000)
        if wait_ms == self._wait.ceiling_ms or wait_ms == self._wait.base_ms:
            log.info(
                "fetch wait %s",
                "back to base: caught up"
                if wait_ms == self._wait.base_ms
                else "at its ceiling: lagging behind a slow broker",
                extra={"consumer": self._name, "fetch_wait_ms": wait_ms},
            )

    async def _lagging(self) -> bool:
        """Whether a partition being fetched has records past the consumer's position."""
        paused = self._consumer.paused()
        # High watermarks first, with no await between: the assignment cannot change under them.
        highwaters = {
            tp: high
            for tp in self._consumer.assignment()
            if tp not in paused and (high := self._consumer.highwater(tp)) is not None
        }  # a paused partition is not fetched: its lag is the batcher's choice
        for tp, highwater in highwaters.items():
            try:
                # Not wait_for: on Python 3.11 it can swallow a cancellation that lands as
                # the position comes back, and the fetch loop it runs in then outlives its
                # service (asking a stopped consumer for records for ever).
                async with asyncio.timeout(_POSITION_TIMEOUT_S):
                    position = await self._consumer.position(tp)
            except (TimeoutError, KafkaError):  # unassigned meanwhile, or still resetting
                continue
            if highwater > position:
                return True
        return False
