"""Slots of a model endpoint leased in Redis, so that several batchers sharing endpoints
never send one more concurrent calls than its capacity.

A lease is a member of the endpoint's sorted set, scored by when it expires on Redis's
own clock (batchers' clocks may differ). Taking one drops expired leases first, so a
batcher that died holding slots gives them back within ``ttl_s``; a lease outlives the
longest call it covers.
"""

from __future__ import annotations

import logging

from brimful.core.redis_client import RedisClient
from brimful.core.redis_keys import RedisKeys

log = logging.getLogger("brimful.worker")

# KEYS[1]: the endpoint's leases. ARGV: holder, capacity, ttl_ms. Returns 1 if leased.
_TAKE_LUA = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now_ms + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
"""


class EndpointLeases:
    """Takes and gives back leases on endpoint slots."""

    def __init__(self, redis: RedisClient, keys: RedisKeys, ttl_s: float, model: str | None = None) -> None:
        """Leases on the slots of one model (None: the default model)."""
        self._redis = redis
        self._keys = keys
        self._model = model
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self._take = redis.register_script(_TAKE_LUA)

    async def take(self, endpoint: str, capacity: int, holder: str) -> bool:
        """Lease one of ``endpoint``'s ``capacity`` slots for ``holder``; False if all are held."""
        key = self._keys.endpoint_slots(endpoint, self._model)
        return bool(await self._take(keys=[key], args=[holder, capacity, self._ttl_ms]))

    async def give_back(self, endpoint: str, holder: str) -> None:
        """Release ``holder``'s lease. Never raises: a lease not given back expires."""
        try:
            await self._redis.zrem(self._keys.endpoint_slots(endpoint, self._model), holder)
        except Exception as error:
            log.warning(
                "could not give an endpoint slot back; it expires", extra={"endpoint": endpoint, "error": repr(error)}
            )

    async def held(self, endpoint: str) -> int:
        """Leases held now on ``endpoint`` (expired ones included until the next take)."""
        return int(await self._redis.zcard(self._keys.endpoint_slots(endpoint, self._model)))
