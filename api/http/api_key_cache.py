"""API keys as an API process checks them: each read from Redis once, then trusted for a
few seconds; a revocation reaches every process at once.

Without it, every request with auth on cost a Redis round trip for its key alone.
``ApiKeys.revoke`` stores the revocation and then announces the key's id on
``RedisKeys.revoked_keys_channel``; each API process follows that channel and forgets the
key, and forgets every key whenever its subscription was interrupted (an announcement may
have gone unheard). ``ttl_s`` bounds the worst case, an announcement lost on a connection
not yet seen to fail: no key is trusted longer than that without being read again.
Unknown keys are not remembered, so a new key works from its first request.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from brimful.core.api_keys import ApiKeys, KeyRecord, digest
from brimful.core.channel_follower import follow_channel
from brimful.core.redis_client import RedisClient

MAX_CACHED_KEYS = 10_000  # a bound on the memory; past it the longest-held key goes first


class ApiKeyCache:
    """Finds a presented key's record, from memory while it is fresh."""

    def __init__(
        self,
        api_keys: ApiKeys,
        redis: RedisClient,
        channel: str,
        ttl_s: float,
        max_keys: int = MAX_CACHED_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api_keys = api_keys
        self._redis = redis
        self._channel = channel
        self._ttl_s = ttl_s
        self._max_keys = max_keys
        self._clock = clock
        self._held: dict[str, tuple[float, KeyRecord]] = {}  # digest -> (trusted until, record); oldest first
        # Bumped whenever keys are forgotten: a lookup that began before must not put back what it read.
        self._generation = 0

    async def find(self, key: str) -> KeyRecord | None:
        """The record of a presented key, or None when unknown."""
        hashed = digest(key)
        if self._ttl_s <= 0:
            return await self._api_keys.find_digest(hashed)
        held = self._held.get(hashed)
        if held is not None and self._clock() < held[0]:
            return held[1]
        generation = self._generation
        record = await self._api_keys.find_digest(hashed)
        self._held.pop(hashed, None)
        if record is not None and generation == self._generation:
            if len(self._held) >= self._max_keys:
                del self._held[next(iter(self._held))]
            self._held[hashed] = (self._clock() + self._ttl_s, record)
        return record

    def forget(self, key_id: str) -> None:
        """Forget the key whose id (its digest's first characters) is ``key_id``."""
        self._generation += 1
        for hashed in [h for h in self._held if h.startswith(key_id)]:
            del self._held[hashed]

    def forget_all(self) -> None:
        """Forget every key (the announcements may have gone unheard)."""
        self._generation += 1
        self._held.clear()

    def __len__(self) -> int:
        """Keys held now."""
        return len(self._held)

    async def follow_revocations(self) -> None:
        """Forget each key as its revocation is announced, until cancelled."""
        await follow_channel(
            self._redis, self._channel, lambda key_id: self.forget(key_id.decode(errors="replace")), self.forget_all
        )
