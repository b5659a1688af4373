"""API keys: who may call, for which tenant, with which scopes.

A key is shown once, when created; Redis keeps only its SHA-256 (``RedisKeys.api_keys``,
a hash of digest -> JSON record), so a leaked database leaks no usable key. A revocation
is announced on ``RedisKeys.revoked_keys_channel``, so API processes that keep keys they
looked up forget it at once.

``ApiKeyCache`` is how an API process checks keys: each read from Redis once, then trusted for a
few seconds; a revocation reaches every process at once.

Without it, every request with auth on cost a Redis round trip for its key alone.
``ApiKeys.revoke`` stores the revocation and then announces the key's id on
``RedisKeys.revoked_keys_channel``; each API process follows that channel and forgets the
key, and forgets every key whenever its subscription was interrupted (an announcement may
have gone unheard). ``ttl_s`` bounds the worst case, an announcement lost on a connection
not yet seen to fail: no key is trusted longer than that without being read again.
Unknown keys are not remembered, so a new key works from its first request."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from enum import StrEnum

from brimful.core.clock import now_ms
from brimful.core.redis_client import RedisClient, as_text, follow_channel
from brimful.core.redis_keys import RedisKeys

KEY_PREFIX = "bf_"
KEY_ID_LENGTH = 12


class Scope(StrEnum):
    SUBMIT = "submit"  # POST and DELETE tasks
    READ = "read"  # GET tasks and stats
    ADMIN = "admin"  # reading the policy; the DLQ entries of the key's own tenant
    OPERATOR = "operator"  # changing the policy every tenant shares; with admin: every tenant's DLQ entries (on-call)


@dataclass(frozen=True)
class KeyRecord:
    """What is stored for a key (never the key itself)."""

    key_id: str  # the first KEY_ID_LENGTH characters of the digest: safe to show and to log
    name: str
    tenant: str
    scopes: tuple[str, ...]
    created_at_ms: int
    revoked_at_ms: int = 0

    @property
    def active(self) -> bool:
        return not self.revoked_at_ms

    def allows(self, scope: Scope) -> bool:
        return self.active and scope.value in self.scopes


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiKeys:
    """Create, find, list and revoke keys."""

    def __init__(self, redis: RedisClient, keys: RedisKeys) -> None:
        self._redis = redis
        self._keys = keys

    async def create(self, tenant: str, scopes: Iterable[Scope], name: str = "") -> tuple[str, KeyRecord]:
        """A new key and its record; the key is returned this once and stored nowhere."""
        if not tenant:
            raise ValueError("a key needs a tenant")
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        hashed = digest(key)
        record = KeyRecord(
            key_id=hashed[:KEY_ID_LENGTH],
            name=name,
            tenant=tenant,
            scopes=tuple(sorted({Scope(s).value for s in scopes})),
            created_at_ms=now_ms(),
        )
        await self._redis.hset(self._keys.api_keys, hashed, json.dumps(asdict(record)))
        return key, record

    async def find(self, key: str) -> KeyRecord | None:
        """The record of a presented key, or None when unknown."""
        return await self.find_digest(digest(key))

    async def find_digest(self, hashed: str) -> KeyRecord | None:
        """The record of the key whose digest is ``hashed``, or None when unknown."""
        raw = await self._redis.hget(self._keys.api_keys, hashed)
        return _record(raw) if raw else None

    async def list(self) -> list[KeyRecord]:
        raw = await self._redis.hgetall(self._keys.api_keys)
        return sorted((_record(value) for value in raw.values()), key=lambda r: r.created_at_ms)

    async def revoke(self, key_id: str) -> KeyRecord | None:
        """Revoke the key whose id is exactly ``key_id`` (as ``list`` shows it); None when
        there is none. A prefix is not enough: it could name another key than meant."""
        raw = await self._redis.hgetall(self._keys.api_keys)
        for hashed, value in raw.items():
            if len(key_id) == KEY_ID_LENGTH and as_text(hashed).startswith(key_id):
                record = _record(value)
                revoked = KeyRecord(**{**asdict(record), "revoked_at_ms": now_ms()})
                await self._redis.hset(self._keys.api_keys, hashed, json.dumps(asdict(revoked)))
                # Stored first: a process that hears of it and reads the key again reads it revoked.
                await self._redis.publish(self._keys.revoked_keys_channel, revoked.key_id)
                return revoked
        return None


def _record(raw: bytes | str) -> KeyRecord:
    data = json.loads(raw)
    data["scopes"] = tuple(data["scopes"])
    return KeyRecord(**data)


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
