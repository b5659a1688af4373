"""Per-tenant rate limits: token buckets in Redis, taken atomically by a Lua script.

Each tenant's bucket holds up to ``burst`` tokens and refills at ``rate`` per second;
a submission of n tasks takes n tokens or none, and each read of a task (GET, long-poll,
DELETE) takes one from a second bucket of its own. The script reads Redis's own clock, so
every API replica shares one bucket per tenant and no race can admit more than the
bucket holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from brimful.api.http.answers import ApiError
from brimful.core.redis_client import RedisClient

# KEYS[1]: the bucket. ARGV: rate per second, burst, tokens wanted.
# Returns {1, 0} when taken, or {0, seconds until enough tokens (as a string)}.
# ``allow-oom``: a Redis at its memory limit still counts reads (a bucket is a small hash a
# tenant, kept a few seconds), so clients can read the results of what was accepted.
_TAKE_LUA = """#!lua flags=allow-oom
local rate, burst, wanted = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local taken, wait = 0, 0
if tokens >= wanted then
  tokens = tokens - wanted
  taken = 1
else
  wait = (wanted - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return {taken, tostring(wait)}
"""


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    retry_after_s: int  # whole seconds, at least 1, when not allowed


class RateLimiter:
    """``take(tenant, n)`` admits n units now or says how long to wait; ``admit`` answers
    429 with Retry-After instead. ``bucket`` names a tenant's bucket key; ``unit`` is what
    is counted, for the message ("tasks", "reads")."""

    def __init__(
        self, redis: RedisClient, bucket: Callable[[str], str], rate_per_s: float, burst: int, unit: str
    ) -> None:
        self._bucket = bucket
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.unit = unit
        self._take = redis.register_script(_TAKE_LUA)

    @property
    def enabled(self) -> bool:
        return self.rate_per_s > 0

    async def take(self, tenant: str, count: int = 1) -> Verdict:
        if not self.enabled:
            return Verdict(True, 0)
        taken, wait = await self._take(keys=[self._bucket(tenant)], args=[self.rate_per_s, self.burst, count])
        if int(taken):
            return Verdict(True, 0)
        return Verdict(False, max(1, math.ceil(float(wait))))

    async def admit(self, tenant: str, count: int = 1) -> None:
        """Take ``count`` units, or answer 429 ``rate_limited`` with Retry-After."""
        verdict = await self.take(tenant, count)
        if not verdict.allowed:
            raise ApiError(
                429,
                "rate_limited",
                f"over the rate of {self.rate_per_s:g} {self.unit}/s (burst {self.burst}); "
                f"retry in {verdict.retry_after_s} s",
                retry_after_s=verdict.retry_after_s,
            )
