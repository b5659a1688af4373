"""A batcher's stop leaves what it cannot finish uncommitted for the partition's next owner:
rows no endpoint can take (every circuit open) at once, without spinning until
``shutdown_wait_s`` runs out (on a virtual clock that never moves: a loop that does not
yield never ends, and the timeout fails it), and batches still running past that wait,
cancelled. Pure control flow, with a recording consumer and runner."""

from __future__ import annotations

import asyncio
import random

import pytest
from aiokafka import TopicPartition

from brimful.batcher.limits import BatcherLimits
from brimful.batcher.service import BatcherService
from brimful.core.policy_params import PolicyParams
from brimful.workers.endpoint_pool import CircuitBreaker, EndpointPool
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


class NeverEnding:
    """A batch runner whose batches never finish (a store or model gone quiet)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = 0
        self.abandoned = 0

    async def run(self, batch: object) -> object:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return None

    async def abandon(self, batch: object, error: BaseException) -> None:
        self.abandoned += 1


@pytest.mark.timeout(10)
async def test_a_batch_still_running_past_the_shutdown_wait_is_cancelled_and_its_rows_left_uncommitted() -> None:
    # Left running, such a batch outlived the model pool and store the process closed next,
    # and was retried on them until it gave its tasks up to the DLQ.
    endpoints = EndpointPool(2, lambda: CircuitBreaker(1, 30.0, 30.0, rng=random.Random(1)))
    pool = ModelPool(["model:8001"], endpoints, connect=lambda url: None, batch_size=64)  # type: ignore[arg-type, return-value]
    consumer = FakeConsumer()
    runner = NeverEnding()
    service = BatcherService(
        consumer,
        TOPIC,
        runner=runner,
        pool=pool,
        retry=BatchRetryPolicy(),
        dead_letters=None,  # type: ignore[arg-type]
        params=PolicyParams(),
        limits=BatcherLimits(shutdown_wait_s=0.3),
    )
    tp = TopicPartition(TOPIC, 0)
    service.assign([tp])
    service._intake.accept({tp: [record_at(7), record_at(8)]})

    await service._shutdown()

    assert runner.started.is_set(), "the shutdown flushed the rows into a batch"
    assert runner.cancelled == 1 and runner.abandoned == 0
    assert not [task for state in service._partitions.values() for task in state.in_flight]
    assert all(offsets[tp].offset <= 7 for offsets in consumer.commits if tp in offsets)
