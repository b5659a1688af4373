"""Endpoint slots leased in a real Redis: a lease cut short by an error gives back every
slot it touched, giving a slot back twice frees it once, a released slot is free at once
while its lease goes back in the background, and closing the pool waits for those leases."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from brimful.batcher.dispatch import SlotLeasing
from brimful.batcher.policy import FlushReason
from brimful.core.redis_keys import RedisKeys
from brimful.stack import EmbeddedStack
from brimful.workers.endpoint_pool import CircuitBreaker, EndpointPool
from brimful.workers.model_pool import EndpointLeases, ModelPool
from brimful.workers.slot import Slot
from brimful.workers.triton_model import TritonModel
from tests.helpers.polling import wait_for

# Nothing listens there: no call is made, the pool only needs clients to hold.
URLS = ["127.0.0.1:9", "127.0.0.1:11"]


@pytest.fixture
async def redis(stack: EmbeddedStack) -> AsyncIterator[Redis]:
    client = Redis.from_url(stack.settings.redis_url)
    yield client
    await client.aclose()


def make_pool(
    redis: Redis,
    keys: RedisKeys,
    urls: list[str] = URLS,
    capacity: int = 1,
    clock: Callable[[], float] = time.monotonic,
) -> ModelPool:
    return ModelPool(
        urls,
        EndpointPool(capacity, lambda: CircuitBreaker(failure_threshold=3)),
        lambda url: TritonModel(url, "m", "", 1.0),
        64,
        leases=EndpointLeases(redis, keys, ttl_s=30),
        clock=clock,
    )


def in_flight(pool: ModelPool) -> dict[str, int]:
    return {url: e.in_flight for url, e in pool.pool.endpoints.items()}


async def test_a_lease_that_fails_after_moving_endpoints_gives_both_places_back(redis: Redis) -> None:
    keys = RedisKeys(f"lease-test-{uuid.uuid4().hex[:8]}")
    pool = make_pool(redis, keys)
    slot = pool.reserve(rows=3)
    assert slot is not None
    first, other = slot.endpoint.url, next(url for url in URLS if url != slot.endpoint.url)
    # Another batcher holds the first endpoint's one slot; the other's lease key is broken,
    # so the move there fails in Redis.
    await redis.zadd(keys.endpoint_slots(first), {"someone-else": (time.time() + 60) * 1000})
    await redis.set(keys.endpoint_slots(other), "not a sorted set")
    try:
        with pytest.raises(ResponseError):
            await pool.secure(slot, rows=3)
        assert in_flight(pool) == {first: 0, other: 0}
        pool.release(slot)  # the caller gives back what it held: already freed, nothing more
        assert in_flight(pool) == {first: 0, other: 0}
        assert all(not e.started for e in pool.pool.endpoints.values())
    finally:
        await redis.delete(keys.endpoint_slots(first), keys.endpoint_slots(other))
        await pool.close()


async def test_a_switch_whose_new_lease_fails_in_redis_leaves_no_slot_taken(redis: Redis) -> None:
    # A call failed transiently and its batch moves to another slot while Redis fails. The
    # new slot was never handed to the batch, so only the pool can give it back; kept, the
    # endpoint's every slot leaks after a few such moves and the batcher never calls again.
    keys = RedisKeys(f"lease-test-{uuid.uuid4().hex[:8]}")
    pool = make_pool(redis, keys)
    slot = pool.reserve(rows=3)
    assert slot is not None
    for url in URLS:
        await redis.set(keys.endpoint_slots(url), "not a sorted set")
    try:
        with pytest.raises(ResponseError):
            await pool.switch(slot, rows=3)
        assert in_flight(pool) == dict.fromkeys(URLS, 0)
        with pytest.raises(ResponseError):
            await pool.secure(await pool.acquire(rows=3), rows=3)  # the call's first lease
        assert in_flight(pool) == dict.fromkeys(URLS, 0)
    finally:
        await redis.delete(*(keys.endpoint_slots(url) for url in URLS))
        await pool.close()


@dataclass
class TwoSlots:
    """Two slots reserved on one endpoint of capacity 2, its leases under keys of their own."""

    keys: RedisKeys
    pool: ModelPool
    url: str
    slot: Slot
    neighbour: Slot


@pytest.fixture
async def two_slots(redis: Redis) -> AsyncIterator[TwoSlots]:
    keys = RedisKeys(f"lease-test-{uuid.uuid4().hex[:8]}")
    pool = make_pool(redis, keys, urls=URLS[:1], capacity=2)
    slot, neighbour = pool.reserve(rows=3), pool.reserve(rows=3)
    assert slot is not None and neighbour is not None
    try:
        yield TwoSlots(keys, pool, URLS[0], slot, neighbour)
    finally:
        await redis.delete(keys.endpoint_slots(URLS[0]))
        await pool.close()


async def wait_for_leases(redis: Redis, key: str, count: int) -> None:
    """Until ``count`` leases are held under ``key`` (leases go back in the background)."""

    async def held() -> bool:
        return await redis.zcard(key) == count

    await wait_for(held, 5, f"{count} leases held", 0.01)


async def test_an_abandoned_lease_is_freed_once_and_given_back_in_redis(redis: Redis, two_slots: TwoSlots) -> None:
    pool, slot, key = two_slots.pool, two_slots.slot, two_slots.keys.endpoint_slots(two_slots.url)
    assert await pool.secure(slot, rows=3) is slot and slot.leased
    assert await redis.zcard(key) == 1
    pool.abandon(slot)
    pool.abandon(slot)  # twice: the neighbour's place stays taken
    assert in_flight(pool) == {two_slots.url: 1}
    await wait_for_leases(redis, key, 0)


async def test_a_released_slot_is_free_at_once_and_gives_back_only_its_own_lease(
    redis: Redis, two_slots: TwoSlots
) -> None:
    pool, slot, neighbour = two_slots.pool, two_slots.slot, two_slots.neighbour
    key = two_slots.keys.endpoint_slots(two_slots.url)
    for held in (slot, neighbour):
        assert await pool.secure(held, rows=3) is held and held.leased
    assert await redis.zcard(key) == 2
    pool.release(slot)
    assert in_flight(pool) == {two_slots.url: 1}  # free here before any round trip: the next batch may go
    await wait_for_leases(redis, key, 1)
    assert await redis.zrange(key, 0, -1) == [neighbour.holder.encode()]


async def test_closing_the_pool_waits_for_the_leases_on_their_way_back(redis: Redis, two_slots: TwoSlots) -> None:
    pool, key = two_slots.pool, two_slots.keys.endpoint_slots(two_slots.url)
    for held in (two_slots.slot, two_slots.neighbour):
        assert await pool.secure(held, rows=3) is held
    assert await redis.zcard(key) == 2
    pool.release(two_slots.slot)
    pool.release(two_slots.neighbour)
    await pool.close()  # a stopping batcher: its leases must not outlive it until they expire
    assert await redis.zcard(key) == 0


async def test_a_batch_leases_its_slot_before_its_rows_leave_and_a_refusal_frees_it(redis: Redis) -> None:
    """Where another batcher holds the endpoint's only slot, the lease is refused: the slot
    is free here again and the endpoint counted full for a moment (the batch keeps filling
    in its accumulator); once the other lets go, the lease is taken and the slot is ready."""
    keys = RedisKeys(f"lease-test-{uuid.uuid4().hex[:8]}")
    now = [1000.0]  # the pool's clock, moved by hand
    pool = make_pool(redis, keys, urls=URLS[:1], capacity=1, clock=lambda: now[0])
    key = keys.endpoint_slots(URLS[0])
    woken: list[int] = []
    leasing = SlotLeasing(pool, lambda: woken.append(1))
    await redis.zadd(key, {"someone-else": (time.time() + 60) * 1000})
    try:
        slot = pool.reserve(rows=40)
        assert slot is not None
        leasing.start(0, slot, FlushReason.TARGET)
        assert leasing.pending(0)
        await wait_for(lambda: not leasing.pending(0), 5, "the lease to be settled", 0.01)
        assert woken and leasing.take_ready(0) is None
        assert in_flight(pool) == {URLS[0]: 0}
        assert pool.capacity().free_slots == 0  # held elsewhere: the policy sees it full

        await redis.zrem(key, "someone-else")
        now[0] += 1.0  # past the moment it was counted full for
        assert pool.capacity().free_slots == 1
        again = pool.reserve(rows=50)
        assert again is not None
        leasing.start(0, again, FlushReason.TARGET)
        await wait_for(lambda: not leasing.pending(0), 5, "the second lease to be settled", 0.01)
        assert leasing.take_ready(0) == (again, FlushReason.TARGET) and again.leased
        assert await redis.zrange(key, 0, -1) == [again.holder.encode()]

        third = pool.reserve(rows=1)
        assert third is None  # the one slot is this batch's
        pool.release(again)
        leased_then_dropped = pool.reserve(rows=1)
        assert leased_then_dropped is not None
        leasing.start(1, leased_then_dropped, FlushReason.FULL)
        leasing.drop(1)  # revoked before the lease settled: the slot and any lease go back
        assert in_flight(pool) == {URLS[0]: 0}
        await wait_for_leases(redis, key, 0)
    finally:
        await redis.delete(key)
        await pool.close()
