"""Idempotency-Key: a client's retry of a submission gets the task its first try made.

A key is first *claimed* while its submission is under way (``pending:<task id>:<ms>``),
then *committed* to the task once the broker has it, or *released* if the task was never
accepted. A claim lives as long as a task may wait: an API killed between the broker's
acknowledgement and the commit leaves it, and a later claimant may take it over. A
committed key lives as long as its task waits; the task's final move shortens it to the
result's retention (the task's record names its key: ``Field.IDEMPOTENCY_KEY``)."""

from __future__ import annotations

from dataclasses import dataclass

from redis.exceptions import RedisError

from brimful.core.clock import now_ms
from brimful.core.redis_client import RedisClient, as_text
from brimful.core.redis_keys import RedisKeys

_PENDING = "pending:"

# KEYS[1]: a key. ARGV: the value it must hold, the value to set instead ("" deletes it),
# the new value's TTL in seconds. Returns 1 when swapped, 0 when the key held anything else.
_SWAP_IF_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
end
return 1
"""


@dataclass(frozen=True)
class IdempotencyHold:
    """What an Idempotency-Key is bound to: the task it was first used for, whether that
    first submission is still under way (its task may never be accepted), and, while it
    is, since when (ms; 0 for a claim of an older release). ``raw``: the value held."""

    task_id: str
    pending: bool
    claimed_at_ms: int = 0
    raw: str = ""


class IdempotencyKeys:
    """Claims, commits and releases of Idempotency-Keys (see the module's docstring)."""

    def __init__(self, redis: RedisClient, keys: RedisKeys, waiting_ttl_s: int) -> None:
        self._redis = redis
        self._keys = keys
        self._waiting_ttl_s = waiting_ttl_s
        self._swap_if = redis.register_script(_SWAP_IF_LUA)

    async def claim(self, key: str, task_id: str) -> IdempotencyHold | None:
        """Claim ``key`` for ``task_id`` while its submission is under way; None when
        claimed. Otherwise what the key holds."""
        redis_key = self._keys.idempotency(key)
        for _ in range(3):  # a claim that lapses between the two reads: claim again
            if await self._redis.set(redis_key, f"{_PENDING}{task_id}:{now_ms()}", nx=True, ex=self._waiting_ttl_s):
                return None
            held = await self._redis.get(redis_key)
            if held is not None:
                value = as_text(held)
                if not value.startswith(_PENDING):
                    return IdempotencyHold(value, pending=False, raw=value)
                claimed, _, at = value.removeprefix(_PENDING).partition(":")
                return IdempotencyHold(claimed, pending=True, claimed_at_ms=int(at) if at.isdigit() else 0, raw=value)
        raise RedisError(f"Idempotency-Key {key!r} kept lapsing while being claimed")

    async def take_over(self, key: str, held: IdempotencyHold, task_id: str) -> bool:
        """Make a pending claim whose submission stopped without a word (its API killed or
        stopped past its grace) this submission's, for ``task_id`` (the stopped one's, or
        a new one when that was never recorded); False if the key changed meanwhile
        (another claimant took it, or its submission ended)."""
        value = f"{_PENDING}{task_id}:{now_ms()}"
        return bool(
            await self._swap_if(keys=[self._keys.idempotency(key)], args=[held.raw, value, self._waiting_ttl_s])
        )

    async def commit(self, key: str, task_id: str) -> bool:
        """Bind the key to ``task_id`` now that the task is accepted, for as long as the
        task may wait; False if the claim is no longer this submission's."""
        redis_key = self._keys.idempotency(key)
        held = await self._redis.get(redis_key)
        if held is None or not as_text(held).startswith(f"{_PENDING}{task_id}"):
            return False
        return bool(await self._swap_if(keys=[redis_key], args=[as_text(held), task_id, self._waiting_ttl_s]))

    async def release(self, key: str, task_id: str) -> None:
        """Free a key whose task was never accepted, so the client's retry can use it
        (only if it still holds this submission's claim). Raises on a Redis error: the
        claim then stays until a retry takes it over."""
        redis_key = self._keys.idempotency(key)
        held = await self._redis.get(redis_key)
        if held is not None and as_text(held).startswith(f"{_PENDING}{task_id}"):
            await self._swap_if(keys=[redis_key], args=[as_text(held), "", 0])
