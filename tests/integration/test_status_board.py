"""The batchers' status board on a real Redis: readers find the live batchers without
scanning the keyspace, however many task keys it holds."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from brimful.core.redis_keys import RedisKeys
from brimful.core.status_board import StatusBoard
from brimful.stack import EmbeddedStack
from tests.helpers.polling import wait_for
from tests.helpers.redis_sends import SendCounter


@pytest.fixture
async def board(stack: EmbeddedStack) -> AsyncIterator[tuple[StatusBoard, Redis, RedisKeys]]:
    redis = Redis.from_url(stack.settings.redis_url)
    keys = RedisKeys(f"board-test-{uuid.uuid4().hex[:8]}")  # a prefix of its own
    try:
        yield StatusBoard(redis, keys), redis, keys
    finally:
        await redis.aclose()


async def test_readers_list_live_batchers_in_member_order_and_drop_expired_ones(
    board: tuple[StatusBoard, Redis, RedisKeys],
) -> None:
    status, redis, keys = board
    await status.publish("b", {"partitions": {"1": {}}}, ttl_s=60)
    await status.publish("a", {"partitions": {"0": {}}}, ttl_s=60)
    assert [s["member"] for s in await status.read_all()] == ["a", "b"]
    assert (await status.read_all())[0]["partitions"] == {"0": {}}
    await status.publish("short-lived", {}, ttl_s=0.05)

    async def expired() -> bool:
        return not await redis.exists(keys.batcher_status("short-lived"))

    await wait_for(expired, 5, "the short-lived status to expire", interval_s=0.01)
    assert [s["member"] for s in await status.read_all()] == ["a", "b"]
    assert await redis.smembers(keys.batcher_members) == {b"a", b"b"}  # the reader dropped it
    await status.remove("a")
    assert [s["member"] for s in await status.read_all()] == ["b"]
    await status.publish("short-lived", {"back": True}, ttl_s=60)  # a batcher that publishes again is listed again
    assert [s["member"] for s in await status.read_all()] == ["b", "short-lived"]


async def test_reading_the_board_costs_the_same_with_many_keys_beside_it(
    board: tuple[StatusBoard, Redis, RedisKeys],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    status, redis, keys = board
    await status.publish("only", {}, ttl_s=60)
    async with redis.pipeline(transaction=False) as pipe:
        for n in range(5000):  # tasks share the keyspace with the board
            pipe.set(keys.task(f"{n:032x}"), "x", ex=60)
        await pipe.execute()
    spy = SendCounter(redis, monkeypatch).start()
    assert [s["member"] for s in await status.read_all()] == ["only"]
    assert spy.stop() == 2  # the member set, then the statuses: no scan over 5000 keys
