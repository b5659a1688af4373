"""The API's key cache (brimful.core.api_keys) against a real Redis: a key is read
once while trusted, and a revocation reaches every process at once, or within the
cache's time when its announcement is lost."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, replace

import pytest
from redis.asyncio import Redis

from brimful.core.api_keys import ApiKeyCache, ApiKeys, KeyRecord, Scope, digest
from brimful.core.redis_keys import RedisKeys
from brimful.stack import EmbeddedStack
from tests.helpers.polling import wait_for
from tests.helpers.redis_sends import SendCounter


@pytest.fixture
def keys() -> RedisKeys:
    return RedisKeys(f"keycache-test-{uuid.uuid4().hex[:8]}")  # keys and channel of this test alone


@pytest.fixture
async def redis(stack: EmbeddedStack) -> AsyncIterator[Redis]:
    client = Redis.from_url(stack.settings.redis_url)
    yield client
    await client.aclose()


async def test_a_key_is_read_from_redis_once_while_it_is_trusted(
    redis: Redis, keys: RedisKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    api_keys = ApiKeys(redis, keys)
    key, record = await api_keys.create("acme", [Scope.SUBMIT])
    cache = ApiKeyCache(api_keys, redis, keys.revoked_keys_channel, ttl_s=60)
    sends = SendCounter(redis, monkeypatch).start()
    assert await cache.find(key) == record
    assert await cache.find(key) == record
    assert await cache.find("bf_unknown") is None
    assert await cache.find("bf_unknown") is None  # unknown keys are read every time: a new key works at once
    assert sends.stop() == 3


async def test_a_revocation_reaches_every_api_process_at_once(stack: EmbeddedStack, keys: RedisKeys) -> None:
    clients = [Redis.from_url(stack.settings.redis_url) for _ in range(3)]
    processes = [ApiKeyCache(ApiKeys(c, keys), c, keys.revoked_keys_channel, ttl_s=3600) for c in clients[:2]]
    following = [asyncio.create_task(p.follow_revocations()) for p in processes]
    cli = ApiKeys(clients[2], keys)  # `brimful keys revoke` runs apart from the API
    try:
        key, record = await cli.create("acme", [Scope.SUBMIT])
        for process in processes:
            assert await process.find(key) == record and len(process) == 1

        async def both_subscribed() -> bool:
            return (
                dict(await clients[2].pubsub_numsub(keys.revoked_keys_channel))[keys.revoked_keys_channel.encode()] == 2
            )

        await wait_for(both_subscribed, 5, "both processes subscribed", 0.01)
        assert await cli.revoke(record.key_id) is not None
        revoked_at = time.monotonic()

        async def refused_everywhere() -> bool:
            found = [await p.find(key) for p in processes]
            return all(r is not None and not r.active for r in found)

        await wait_for(
            refused_everywhere, 5, "the revocation heard everywhere", 0.01
        )  # only the announcement can do it: the cache trusts keys for an hour
        assert time.monotonic() - revoked_at < 1.0
    finally:
        for task in following:
            task.cancel()
        await asyncio.gather(*following, return_exceptions=True)
        for client in clients:
            await client.aclose()


async def test_a_revocation_whose_announcement_is_lost_holds_no_longer_than_the_ttl(
    redis: Redis, keys: RedisKeys
) -> None:
    api_keys = ApiKeys(redis, keys)
    key, record = await api_keys.create("acme", [Scope.SUBMIT])
    now = [1000.0]
    cache = ApiKeyCache(api_keys, redis, keys.revoked_keys_channel, ttl_s=5, clock=lambda: now[0])
    assert (await cache.find(key)).active  # type: ignore[union-attr]
    # Revoked in Redis with no announcement (as if the message were lost).
    revoked = replace(record, revoked_at_ms=1)
    await redis.hset(keys.api_keys, digest(key), json.dumps(asdict(revoked)))
    now[0] += 4.9
    assert (await cache.find(key)).active  # type: ignore[union-attr]
    now[0] += 0.2
    assert await cache.find(key) == revoked


async def test_every_key_is_forgotten_when_the_subscription_was_cut(stack: EmbeddedStack, keys: RedisKeys) -> None:
    name = f"keycache-{uuid.uuid4().hex[:8]}"
    client = Redis.from_url(stack.settings.redis_url, client_name=name)
    admin = Redis.from_url(stack.settings.redis_url)
    api_keys = ApiKeys(client, keys)
    cache = ApiKeyCache(api_keys, client, keys.revoked_keys_channel, ttl_s=3600)
    following = asyncio.create_task(cache.follow_revocations())
    try:
        key, record = await api_keys.create("acme", [Scope.SUBMIT])
        assert (await cache.find(key)).active  # type: ignore[union-attr]
        await admin.hset(keys.api_keys, digest(key), json.dumps(asdict(replace(record, revoked_at_ms=1))))

        async def subscription_id() -> int | None:
            for entry in await admin.client_list(_type="pubsub"):
                if entry.get("name") == name:
                    return int(entry["id"])
            return None

        async def subscribed() -> bool:
            return await subscription_id() is not None

        await wait_for(subscribed, 5, "the subscription", 0.01)
        await admin.client_kill_filter(_id=await subscription_id())  # the revocation may have been said meanwhile

        async def read_again() -> bool:
            return not (await cache.find(key)).active  # type: ignore[union-attr]

        await wait_for(read_again, 5, "the key read again", 0.01)
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
        await client.aclose()
        await admin.aclose()


async def test_the_keys_held_are_bounded_and_the_longest_held_goes_first(
    redis: Redis, keys: RedisKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    api_keys = ApiKeys(redis, keys)
    made = [(await api_keys.create("acme", [Scope.READ]))[0] for _ in range(5)]
    cache = ApiKeyCache(api_keys, redis, keys.revoked_keys_channel, ttl_s=60, max_keys=3)
    for key in made:
        await cache.find(key)
    assert len(cache) == 3
    sends = SendCounter(redis, monkeypatch).start()
    for key in made[2:]:
        await cache.find(key)  # held
    await cache.find(made[0])  # let go: read again
    assert sends.stop() == 1


class _GatedKeys:
    """Reads a record only when let through, so a test can act while a lookup is under way."""

    def __init__(self, record: KeyRecord) -> None:
        self.record = record
        self.gate = asyncio.Event()
        self.reads = 0

    async def find_digest(self, hashed: str) -> KeyRecord | None:
        self.reads += 1
        await self.gate.wait()
        return self.record


async def test_a_lookup_under_way_when_its_key_is_forgotten_is_not_kept() -> None:
    record = KeyRecord(key_id=digest("bf_x")[:12], name="", tenant="acme", scopes=("read",), created_at_ms=0)
    gated = _GatedKeys(record)
    cache = ApiKeyCache(gated, None, "", ttl_s=60)  # type: ignore[arg-type]
    lookup = asyncio.create_task(cache.find("bf_x"))
    await wait_for(lambda: gated.reads > 0, 5, "the lookup to reach the key store", interval_s=0)
    cache.forget(record.key_id)  # revoked while the old record was on its way
    gated.gate.set()
    assert await lookup == record  # that request was let in, as it would have been a moment earlier
    assert len(cache) == 0  # but what it read is not trusted for the next
    await cache.find("bf_x")
    assert gated.reads == 2
