"""A batcher stopped while its rows cannot be dispatched (every endpoint's circuit open)
gives up at once and leaves them uncommitted for the partition's next owner: it must not
spin without yielding until ``shutdown_wait_s`` runs out. Pure control flow on a virtual
clock that never moves: a loop that does not yield never ends, and the timeout fails it."""

from __future__ import annotations

import random

import pytest
from aiokafka import TopicPartition

from brimful.batcher.limits import BatcherLimits
from brimful.batcher.service import BatcherService
from brimful.core.policy_params import PolicyParams
from brimful.workers.circuit_breaker import CircuitBreaker
from brimful.workers.endpoint_pool import EndpointPool
from brimful.workers.model_pool import ModelPool
from brimful.workers.retry_policy import BatchRetryPolicy
from tests.helpers.fake_consumer import TOPIC, FakeConsumer, record_at


@pytest.mark.timeout(10)
async def test_stopping_with_rows_no_endpoint_can_take_returns_at_once_and_commits_none_of_them() -> None:
    now = 100.0
    endpoints = EndpointPool(2, lambda: CircuitBreaker(1, 30.0, 30.0, rng=random.Random(1)))
    pool = ModelPool(["model:8001"], endpoints, connect=lambda url: None, batch_size=64, clock=lambda: now)  # type: ignore[arg-type, return-value]
    endpoint = endpoints.endpoints["model:8001"]
    endpoints.record_call(endpoint, now - 1, now, 64, transient_failure=True)  # the circuit opens
    assert pool.capacity().free_slots == 0
    consumer = FakeConsumer()
    service = BatcherService(
        consumer,
        TOPIC,
        runner=None,  # type: ignore[arg-type]  # no batch runs here
        pool=pool,
        retry=BatchRetryPolicy(),
        dead_letters=None,  # type: ignore[arg-type]
        params=PolicyParams(),
        limits=BatcherLimits(shutdown_wait_s=30.0),
        clock=lambda: now,
    )
    tp = TopicPartition(TOPIC, 0)
    service.assign([tp])
    service._intake.accept({tp: [record_at(7), record_at(8)]})
    assert service.snapshot()["partitions"]["0"]["pending"] == 2  # type: ignore[index]

    await service._shutdown()

    assert service.snapshot()["partitions"]["0"]["pending"] == 2  # type: ignore[index]
    # Nothing committed past the rows that never ran: the next owner reads them again.
    assert all(offsets[tp].offset <= 7 for offsets in consumer.commits if tp in offsets)
