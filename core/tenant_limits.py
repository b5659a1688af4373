"""Per-tenant limits: the largest task payload, the most tasks in flight and the most bytes
of files kept; and each tenant's rates (``RateLimiter``).

Defaults come from settings; an operator overrides them per tenant with
``brimful tenants set``, stored in Redis (``RedisKeys.tenant_limits``) so every API
replica sees the change within ``CACHE_S``.

Tasks in flight are counted exactly, not estimated: each tenant has a sorted set of
its unfinished task ids (scored by submission time). The task store adds an id in the
same atomic step that records the task as queued, after checking the limit
(``TaskStore.create_queued``), and removes it when the task reaches a final state. Ids
are a set, so a replayed or redelivered task can never be counted twice; entries older
than the retention time are dropped, so a task that somehow expired unfinished cannot
hold a slot forever.

Rates are token buckets in Redis, taken atomically by a Lua script. Each tenant's bucket
holds up to ``burst`` tokens and refills at ``rate`` per second; a submission of n tasks
takes n tokens or none, and each read of a task (GET, long-poll, DELETE) takes one from a
second bucket of its own. The script reads Redis's own clock, so every API replica shares
one bucket per tenant and no race can admit more than the bucket holds.

Where a tenant's rate is high, an API process takes a few tokens ahead with the ones it
needs (``rate_limit_lease_ms`` of the rate, ``RateLimiter``'s lease) and admits from them
without a round trip until they are spent or that time has passed; what is left then is
dropped, never given back. A token is still taken from the shared bucket before anything is
admitted on it, so the limit is as strict as before: a lease never admits more. Tokens go
ahead only from the upper half of the bucket, so what leases drop cannot empty it for a
tenant under its rate; near the limit each request takes its own, as without leases.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from brimful.core.redis_client import RedisClient, as_text
from brimful.core.redis_keys import RedisKeys

CACHE_S = 1.0  # how stale an API replica's copy of a tenant's limits may be


@dataclass(frozen=True)
class TenantLimits:
    """What one tenant may send. 0 means no limit."""

    max_payload_bytes: int
    max_in_flight: int
    max_stored_bytes: int = 0


class TenantLimitStore:
    """Reads and sets per-tenant limits, and counts a tenant's tasks in flight."""

    def __init__(self, redis: RedisClient, keys: RedisKeys, defaults: TenantLimits) -> None:
        self._redis = redis
        self._keys = keys
        self.defaults = defaults
        self._cache: dict[str, tuple[float, TenantLimits]] = {}
        self._loading: dict[str, asyncio.Future[TenantLimits]] = {}  # reads under way, one a tenant

    async def get(self, tenant: str) -> TenantLimits:
        """The tenant's limits: its override if one is set, else the defaults (cached briefly).
        One read refreshes a stale copy for every request that needs it meanwhile: when each
        read Redis on its own, 48 reads a second instead of one queued for the connection
        pool at saturation (7% of the API's profile)."""
        cached = self._cache.get(tenant)
        if cached is not None and time.monotonic() - cached[0] < CACHE_S:
            return cached[1]
        loading = self._loading.get(tenant)
        if loading is None:
            loading = asyncio.ensure_future(self._load(tenant))
            self._loading[tenant] = loading
            loading.add_done_callback(functools.partial(self._loaded, tenant))
        # Shielded: a caller that goes away does not cancel the read the others wait for.
        return await asyncio.shield(loading)

    async def _load(self, tenant: str) -> TenantLimits:
        started = time.monotonic()
        limits = self._parse(await self._redis.hget(self._keys.tenant_limits, tenant))
        self._cache[tenant] = (started, limits)
        return limits

    def _loaded(self, tenant: str, done: asyncio.Future[TenantLimits]) -> None:
        self._loading.pop(tenant, None)
        if not done.cancelled():
            done.exception()  # heard by whoever waited; never "exception was never retrieved"

    async def set(
        self,
        tenant: str,
        max_payload_bytes: int | None = None,
        max_in_flight: int | None = None,
        max_stored_bytes: int | None = None,
    ) -> TenantLimits:
        """Override some of a tenant's limits (None keeps the current value)."""
        current = self._parse(await self._redis.hget(self._keys.tenant_limits, tenant))
        given = {"max_payload_bytes": max_payload_bytes, "max_in_flight": max_in_flight}
        given["max_stored_bytes"] = max_stored_bytes
        current = replace(current, **{name: value for name, value in given.items() if value is not None})
        if min(asdict(current).values()) < 0:
            raise ValueError("limits are 0 (none) or more")
        await self._redis.hset(self._keys.tenant_limits, tenant, json.dumps(asdict(current)))
        self._cache.pop(tenant, None)
        return current

    async def reset(self, tenant: str) -> bool:
        """Drop a tenant's override; it falls back to the defaults. False if it had none."""
        self._cache.pop(tenant, None)
        return bool(await self._redis.hdel(self._keys.tenant_limits, tenant))

    async def overrides(self) -> dict[str, TenantLimits]:
        """Every tenant with its own limits."""
        raw = await self._redis.hgetall(self._keys.tenant_limits)
        return {as_text(tenant): self._parse(value) for tenant, value in sorted(raw.items())}

    async def in_flight(self, tenant: str) -> int:
        """The tenant's tasks accepted and not yet final."""
        return int(await self._redis.zcard(self._keys.in_flight(tenant)))

    def _parse(self, raw: bytes | str | None) -> TenantLimits:
        if not raw:
            return self.defaults
        data = json.loads(raw)
        return TenantLimits(
            max_payload_bytes=int(data.get("max_payload_bytes", self.defaults.max_payload_bytes)),
            max_in_flight=int(data.get("max_in_flight", self.defaults.max_in_flight)),
            max_stored_bytes=int(data.get("max_stored_bytes", self.defaults.max_stored_bytes)),
        )


# --- from core/tenant_limits.py ---
# Per-tenant rate limits: token buckets in Redis, taken atomically by a Lua script.
# KEYS[1]: the bucket. ARGV: rate per second, burst, tokens wanted, tokens more to lease
# (taken only from above half the burst, whole, up to that many).
# Returns {tokens taken, 0} when the wanted ones were (with the leased ones, if any), or
# {0, seconds until enough tokens (as a string)}.
# ``allow-oom``: a Redis at its memory limit still counts reads (a bucket is a small hash a
# tenant, kept a few seconds), so clients can read the results of what was accepted.
_TAKE_LUA = """#!lua flags=allow-oom
local rate, burst, wanted = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ahead = tonumber(ARGV[4]) or 0
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local taken, wait = 0, 0
if tokens >= wanted then
  -- Ahead only from the bucket's upper half: leases dropped unused never empty it for a
  -- tenant under its rate; near the limit every request takes just its own.
  taken = wanted + math.max(0, math.min(ahead, math.floor(tokens - wanted - burst / 2)))
  tokens = tokens - taken
else
  wait = (wanted - tokens) / rate
end
-- Written to the microsecond: tostring keeps 14 digits, a tenth of a millisecond of a Unix time,
-- and the refills of many calls in a row then drifted by several tokens at high rates.
redis.call('HSET', KEYS[1], 'tokens', string.format('%.9f', tokens), 'at', string.format('%.6f', now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return {taken, tostring(wait)}
"""


# Tenants whose leases a process holds at most; past it, those run out go, then the oldest.
MAX_LEASES = 10_000


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    retry_after_s: int  # whole seconds, at least 1, when not allowed


class RateLimiter:
    """``take(tenant, n)`` admits n units now or says how long to wait
    (``api/http/guards.py``'s ``admit`` answers 429 with Retry-After instead). ``bucket`` names a tenant's bucket key; ``unit`` is what
    is counted, for the message ("tasks", "reads")."""

    def __init__(
        self,
        redis: RedisClient,
        bucket: Callable[[str], str],
        rate_per_s: float,
        burst: int,
        unit: str,
        lease_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._bucket = bucket
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.unit = unit
        self._take = redis.register_script(_TAKE_LUA)
        # Tokens taken ahead (``lease_s`` of the rate; none below two): what a lease holds
        # (at most a burst), and by tenant, how many are left and until when they may be used.
        self._ahead = min(burst, int(rate_per_s * lease_s)) if rate_per_s * lease_s >= 2 else 0
        self._lease_s = lease_s
        self._clock = clock
        self._leases: dict[str, tuple[int, float]] = {}

    @property
    def enabled(self) -> bool:
        return self.rate_per_s > 0

    async def take(self, tenant: str, count: int = 1) -> Verdict:
        if not self.enabled:
            return Verdict(True, 0)
        if self._from_lease(tenant, count):
            return Verdict(True, 0)
        args = [self.rate_per_s, self.burst, count, self._ahead]
        taken, wait = await self._take(keys=[self._bucket(tenant)], args=args)
        if int(taken) >= count:
            self._lease(tenant, int(taken) - count)
            return Verdict(True, 0)
        return Verdict(False, max(1, math.ceil(float(wait))))

    def _from_lease(self, tenant: str, count: int) -> bool:
        """Whether ``count`` tokens were taken from this process's lease for ``tenant``."""
        left, until = self._leases.get(tenant, (0, 0.0))
        if left < count or self._clock() >= until:
            return False
        self._leases[tenant] = (left - count, until)
        return True

    def _lease(self, tenant: str, tokens: int) -> None:
        """Hold ``tokens`` taken ahead for ``tenant``, with what is left of a lease still good
        (another request's, taken meanwhile), for ``lease_s`` from now."""
        if tokens <= 0:
            return
        now = self._clock()
        left, until = self._leases.pop(tenant, (0, 0.0))
        if len(self._leases) >= MAX_LEASES:
            self._leases = {t: lease for t, lease in self._leases.items() if lease[1] > now}
            while len(self._leases) >= MAX_LEASES:
                del self._leases[next(iter(self._leases))]
        self._leases[tenant] = ((left if until > now else 0) + tokens, now + self._lease_s)
