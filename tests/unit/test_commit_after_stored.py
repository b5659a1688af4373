"""Offsets are committed no sooner than ``commit_after_stored_s`` after their batch's
results were stored: a Redis that syncs its log every second loses up to that much to a
kill, and the records of what it lost must be read again. Pure control flow on the real
event loop with a stand-in consumer that records commits."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import pytest
from aiokafka import TopicPartition

from brimful.batcher.service import BatcherLimits, BatcherService
from brimful.core.policy_params import PolicyParams
from brimful.workers.circuit_breaker import CircuitBreaker
from brimful.workers.endpoint_pool import EndpointPool
from brimful.workers.model_pool import ModelPool
from tests.helpers.fake_consumer import TOPIC, FakeConsumer, record_at
from tests.helpers.polling import wait_for


@pytest.mark.timeout(10)
async def test_offsets_wait_their_lag_and_later_ones_wait_for_the_next_round() -> None:
    endpoints = EndpointPool(1, lambda: CircuitBreaker(1, 1000.0, 1000.0, rng=random.Random(1)))
    pool = ModelPool(["model:8001"], endpoints, connect=lambda url: None, batch_size=64)  # type: ignore[arg-type, return-value]
    consumer = FakeConsumer()
    service = BatcherService(
        consumer,
        TOPIC,
        SimpleNamespace(pool=pool),
        dead_letters=None,  # type: ignore[arg-type]
        params=PolicyParams(),
        limits=BatcherLimits(commit_after_stored_s=0.3, commit_every_s=0.01),
    )
    tp = TopicPartition(TOPIC, 0)
    service.assign([tp])
    service._accept({tp: [record_at(offset) for offset in range(4)]})
    state = service._partitions[0]
    committer = asyncio.create_task(service._commit_loop())
    try:
        loop = asyncio.get_running_loop()
        service._finish_offsets(state, [0, 1])
        finished_at = loop.time()
        await asyncio.sleep(0.1)
        service._finish_offsets(state, [2])  # finished while the first round waits
        await wait_for(lambda: len(consumer.commits) >= 1, 5, "the first commit", interval_s=0.01)
        assert loop.time() - finished_at >= 0.3
        assert consumer.commits[0][tp].offset == 2  # offset 2 waits for a round of its own
        await wait_for(lambda: len(consumer.commits) >= 2, 5, "the second commit", interval_s=0.01)
        assert consumer.commits[1][tp].offset == 3
    finally:
        committer.cancel()
