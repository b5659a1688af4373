"""API keys: who may call, for which tenant, with which scopes.

A key is shown once, when created; Redis keeps only its SHA-256 (``RedisKeys.api_keys``,
a hash of digest -> JSON record), so a leaked database leaks no usable key. A revocation
is announced on ``RedisKeys.revoked_keys_channel``, so API processes that keep keys they
looked up (``brimful.api.http.api_key_cache``) forget it at once.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from enum import StrEnum

from brimful.core.clock import now_ms
from brimful.core.redis_client import RedisClient, as_text
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
