"""Slots that stand still are a fault, with a bound: taking a slot gives up after
``slot_wait_s`` while an endpoint serves, a batcher whose rows wait while no slot moves
fails its liveness probe, and neither counts an outage (every circuit open) as a stall.
Pure logic on a virtual clock."""

from __future__ import annotations

import asyncio
import random

import pytest
from aiokafka import TopicPartition

from brimful.batcher.health_server import Probes, answer
from brimful.batcher.limits import BatcherLimits
from brimful.batcher.service import BatcherService
from brimful.core.policy_params import PolicyParams
from brimful.workers.endpoint_pool import CircuitBreaker, EndpointPool
from brimful.workers.model_pool import ModelPool
from brimful.workers.retry_policy import BatchRetryPolicy
from brimful.workers.slot import NoSlotInTime, Slot
from tests.helpers.fake_consumer import TOPIC, FakeConsumer, record_at


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _pool(clock: _Clock, slot_wait_s: float) -> ModelPool:
    # A circuit, once open, stays open for far longer than any test here looks.
    endpoints = EndpointPool(1, lambda: CircuitBreaker(1, 1000.0, 1000.0, rng=random.Random(1)))
    return ModelPool(
        ["model:8001"],
        endpoints,
        connect=lambda url: None,
        batch_size=64,
        clock=clock,  # type: ignore[arg-type, return-value]
        slot_wait_s=slot_wait_s,
    )


def _one_slot_held() -> tuple[_Clock, ModelPool, Slot]:
    """A pool of one slot on a virtual clock, that slot taken."""
    clock = _Clock()
    pool = _pool(clock, slot_wait_s=5.0)
    held = pool.reserve(64)
    assert held is not None
    return clock, pool, held


@pytest.mark.timeout(10)
async def test_taking_a_slot_gives_up_once_none_moved_for_the_bound() -> None:
    clock, pool, _ = _one_slot_held()
    waiting = asyncio.ensure_future(pool.acquire(64))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    clock.now += 4.0
    await asyncio.sleep(0.3)  # the pool looks again at least every 0.25 s
    assert not waiting.done()
    clock.now += 2.0
    with pytest.raises(NoSlotInTime):
        await asyncio.wait_for(waiting, 1.0)


@pytest.mark.timeout(10)
async def test_a_slot_given_back_ends_the_wait() -> None:
    _, pool, held = _one_slot_held()
    waiting = asyncio.ensure_future(pool.acquire(64))
    await asyncio.sleep(0.01)
    pool.release(held)
    assert (await asyncio.wait_for(waiting, 1.0)).endpoint.url == "model:8001"


@pytest.mark.timeout(10)
async def test_an_outage_is_no_stall() -> None:
    clock = _Clock()
    pool = _pool(clock, slot_wait_s=5.0)
    endpoint = pool.pool.endpoints["model:8001"]
    pool.pool.record_call(endpoint, clock.now - 1, clock.now, 64, transient_failure=True)  # its circuit opens
    waiting = asyncio.ensure_future(pool.acquire(64))
    clock.now += 20.0
    await asyncio.sleep(0.3)
    assert not waiting.done()
    waiting.cancel()


def test_rows_waiting_while_no_slot_moves_fail_liveness_after_the_bound() -> None:
    clock = _Clock()
    pool = _pool(clock, slot_wait_s=5.0)
    service = BatcherService(
        FakeConsumer(),
        TOPIC,
        runner=None,  # type: ignore[arg-type]  # no batch runs here
        pool=pool,
        retry=BatchRetryPolicy(),
        dead_letters=None,  # type: ignore[arg-type]
        params=PolicyParams(),
        limits=BatcherLimits(),
        clock=clock,
    )
    probes = Probes(
        seconds_since_fetch=lambda: 0.0,
        consuming=lambda: True,
        status=dict,
        slots_stalled_s=service.slots_stalled_s,
        stall_after_s=10.0,
    )
    clock.now += 3600.0  # idle for an hour: no row waits, so nothing is stalled
    assert service.slots_stalled_s() == 0.0
    tp = TopicPartition(TOPIC, 0)
    service.assign([tp])
    service._intake.accept({tp: [record_at(7)]})
    clock.now += 9.0
    assert answer("GET", "/healthz", probes).status == 200
    clock.now += 2.0
    stalled = answer("GET", "/healthz", probes)
    assert stalled.status == 503 and b'"slots_stalled_s": 11.0' in stalled.body
    assert pool.reserve(64) is not None  # a slot moves: alive again
    assert answer("GET", "/healthz", probes).status == 200


@pytest.mark.timeout(10)
async def test_a_batch_that_gives_its_slot_back_and_wants_another_waits_its_turn() -> None:
    # One slot. A batch isolating a failing row gives its slot back after each call and wants
    # it again at once; another batch already waits. Before, the first took it back every
    # time (its take ran before the waiter woke) and the waiter starved until NoSlotInTime.
    _, pool, isolating = _one_slot_held()
    waiting = asyncio.ensure_future(pool.acquire(64))
    await asyncio.sleep(0)  # it queues for the slot
    pool.release(isolating)
    assert pool.reserve(64) is None  # a new batch does not jump the queue either
    again = asyncio.ensure_future(pool.acquire(64))  # the isolating batch's next call
    served = await asyncio.wait_for(waiting, 1.0)
    await asyncio.sleep(0.01)
    assert not again.done()  # behind the batch that waited first
    pool.release(served)
    await asyncio.wait_for(again, 1.0)


@pytest.mark.timeout(10)
async def test_slots_that_move_to_others_first_are_no_stall() -> None:
    clock, pool, held = _one_slot_held()
    queued = [asyncio.ensure_future(pool.acquire(64)) for _ in range(3)]
    await asyncio.sleep(0.01)
    for turn in range(2):  # the slot moves every 4 s, each time to the batch first in line
        clock.now += 4.0
        pool.release(held)
        held = await asyncio.wait_for(queued[turn], 1.0)
        await asyncio.sleep(0.01)
    # The last waited 8 s, past the 5 s bound, and is no stall: slots moved meanwhile.
    assert not queued[2].done()
    pool.release(held)
    await asyncio.wait_for(queued[2], 1.0)
