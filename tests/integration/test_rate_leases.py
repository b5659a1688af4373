"""Rate limits with tokens taken ahead, on a real Redis: a process admits from its lease
without a round trip, a lease runs out with its time, and processes that lease never admit
more than the shared bucket holds."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from brimful.core import tenant_limits
from brimful.core.redis_keys import RedisKeys
from brimful.core.settings import Settings
from brimful.core.tenant_limits import RateLimiter
from brimful.stack import EmbeddedStack
from tests.helpers.redis_sends import SendCounter
from tests.helpers.stacks import stack_settings

LEASE_S = Settings().rate_limit_lease_ms / 1000  # the default: 10 ms, 10 tokens at 1,000 a second


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    server = EmbeddedStack(stack_settings(), tmp_path_factory.mktemp("rate-leases"))
    try:
        server.start_redis()
        yield server
    finally:
        server.stop()


@pytest.fixture
async def redis(redis_server: EmbeddedStack) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.settings.redis_url)
    yield client
    await client.aclose()


def limiter(redis: Redis, rate: float, burst: int, clock: ManualClock | None = None) -> RateLimiter:
    keys = RedisKeys(f"lease-test-{uuid.uuid4().hex[:8]}")  # buckets of this test's own
    return RateLimiter(redis, keys.rate_bucket, rate, burst, "tasks", LEASE_S, clock or time.monotonic)


async def warm(limits: RateLimiter) -> None:
    """A connection open and the script loaded, so the sends counted after are takes only."""
    assert (await limits.take("warm-up")).allowed


async def test_leased_tokens_are_admitted_without_a_round_trip(redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    limits = limiter(redis, rate=1000, burst=100, clock=ManualClock())  # a lease of 10 ms: 10 tokens
    await warm(limits)
    sends = SendCounter(redis, monkeypatch).start()
    verdicts = [await limits.take("acme") for _ in range(12)]
    assert all(verdict.allowed for verdict in verdicts)
    assert sends.stop() == 2  # the first took 1 and 10 ahead; the 12th found the lease spent


async def test_a_lease_runs_out_with_its_time(redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    limits = limiter(redis, rate=1000, burst=100, clock=clock)
    assert (await limits.take("acme")).allowed
    sends = SendCounter(redis, monkeypatch).start()
    assert (await limits.take("acme")).allowed  # from the lease
    clock.now += LEASE_S
    assert (await limits.take("acme")).allowed  # its tokens left are dropped, not used late
    assert sends.stop() == 1


async def test_a_slow_rate_takes_nothing_ahead(redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    limits = limiter(redis, rate=100, burst=5, clock=ManualClock())  # one token in 10 ms: no lease
    await warm(limits)
    sends = SendCounter(redis, monkeypatch).start()
    verdicts = [await limits.take("acme") for _ in range(6)]
    assert [verdict.allowed for verdict in verdicts] == [True] * 5 + [False]
    assert sends.stop() == 6


@pytest.mark.parametrize("lease_s", [0.0, LEASE_S], ids=["no-lease", "lease"])
async def test_processes_never_admit_more_than_the_bucket_holds(
    redis: Redis, monkeypatch: pytest.MonkeyPatch, lease_s: float
) -> None:
    # Thousands of takes a second: a bucket that kept its time to a tenth of a millisecond
    # drifted by several tokens over them (no lease too), where to the microsecond it holds.
    rate, burst = 2000.0, 50
    keys = RedisKeys(f"lease-test-{uuid.uuid4().hex[:8]}")
    processes = [RateLimiter(redis, keys.rate_bucket, rate, burst, "tasks", lease_s) for _ in range(3)]
    admitted = refused = 0
    sends = SendCounter(redis, monkeypatch).start()
    started = time.monotonic()

    async def drive(limits: RateLimiter) -> None:
        nonlocal admitted, refused
        while time.monotonic() - started < 0.5:
            if (await limits.take("acme")).allowed:
                admitted += 1
            else:
                refused += 1

    await asyncio.gather(*(drive(limits) for limits in processes))
    elapsed = time.monotonic() - started
    round_trips = sends.stop()
    assert refused > 0, "the processes never met the limit: nothing was tested"
    assert admitted <= burst + rate * elapsed, (admitted, elapsed)
    if lease_s:
        assert round_trips < admitted + refused  # some were admitted from leases


async def test_a_tenant_under_its_rate_is_never_refused_for_what_leases_dropped(redis: Redis) -> None:
    # Four processes each use 2 of the 10 tokens a lease takes ahead: 800 a second in all,
    # under the rate of 1,000, while what they take ahead is four times the rate.
    rate, burst = 1000.0, 40
    keys = RedisKeys(f"lease-test-{uuid.uuid4().hex[:8]}")
    processes = [RateLimiter(redis, keys.rate_bucket, rate, burst, "tasks", LEASE_S) for _ in range(4)]
    refused = 0

    async def drive(limits: RateLimiter) -> None:
        nonlocal refused
        loop = asyncio.get_running_loop()
        started = loop.time()
        for sent in range(200):  # 200 a second, each at its time: the arrivals under test
            await asyncio.sleep(max(0.0, started + sent / 200 - loop.time()))
            refused += not (await limits.take("acme")).allowed

    await asyncio.gather(*(drive(limits) for limits in processes))
    assert refused == 0


async def test_leases_held_are_bounded_and_the_oldest_go_first(redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tenant_limits, "MAX_LEASES", 3)
    limits = limiter(redis, rate=1000, burst=100, clock=ManualClock())
    for tenant in ("t0", "t1", "t2", "t3"):
        assert (await limits.take(tenant)).allowed  # each leases 10 ahead
    sends = SendCounter(redis, monkeypatch).start()
    assert (await limits.take("t3")).allowed  # held
    assert sends.sends == 0
    assert (await limits.take("t0")).allowed  # the oldest, gone to make room
    assert sends.stop() == 1
