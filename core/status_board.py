"""Each running batcher's live status in Redis, so one place shows them all."""

from __future__ import annotations

import json
from typing import Any, Mapping

from brimful.core.redis_client import RedisClient
from brimful.core.redis_keys import RedisKeys


class StatusBoard:
    """Batchers publish a snapshot every second or so; readers list the fresh ones."""

    def __init__(self, redis: RedisClient, keys: RedisKeys) -> None:
        self._redis = redis
        self._keys = keys

    async def publish(self, member: str, snapshot: Mapping[str, Any], ttl_s: float) -> None:
        # A short TTL makes a dead batcher drop off the board by itself.
        await self._redis.set(
            self._keys.batcher_status(member), json.dumps({"member": member, **snapshot}), px=int(ttl_s * 1000)
        )

    async def remove(self, member: str) -> None:
        """Take a stopping batcher off the board at once."""
        await self._redis.delete(self._keys.batcher_status(member))

    async def read_all(self) -> list[dict[str, Any]]:
        keys = [key async for key in self._redis.scan_iter(match=self._keys.batcher_status_pattern, count=100)]
        if not keys:
            return []
        values = await self._redis.mget(keys)
        return sorted((json.loads(v) for v in values if v is not None), key=lambda s: str(s.get("member")))
