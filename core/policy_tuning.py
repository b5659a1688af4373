"""Changing the flush policy of every running batcher, without a restart.

The parameters changed at run time live in Redis (``RedisKeys.policy``), overlaid on the
settings' defaults. Which parameters are tunable, and their bounds, are the settings'
(``core/policy_params.py`` reads them). Batchers re-read them every ``poll_interval`` and apply them to
their accumulators on the spot; a restarted batcher reads them at start. Every change is
validated as a whole (an impossible combination is refused with the reason) and kept in
a history with old and new values and the time.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import Any

from redis.exceptions import WatchError

from brimful.core.clock import now_ms
from brimful.core.number_text import finite_number
from brimful.core.policy_params import TUNABLE, PolicyParams, bounds
from brimful.core.redis_client import RedisClient, as_text
from brimful.core.redis_keys import RedisKeys
from brimful.core.settings import Settings

log = logging.getLogger("brimful.tuning")

_HISTORY_LENGTH = 200


class TuningError(ValueError):
    """A change that cannot be applied; the message says why."""


def defaults_from_settings(settings: Settings) -> dict[str, float]:
    return {name: float(getattr(settings, name)) for name in TUNABLE}


def params_from_values(values: Mapping[str, float], batch_size: int) -> PolicyParams:
    """The policy's parameters (seconds) from tunable values (the settings' units)."""
    return PolicyParams.from_knobs(values, batch_size)


def apply_changes(current: Mapping[str, float], changes: Mapping[str, Any], batch_size: int) -> dict[str, float]:
    """The values after ``changes``, or TuningError naming what is wrong with them."""
    if not changes:
        raise TuningError(f"no parameters given; tunable: {', '.join(TUNABLE)}")
    unknown = sorted(set(changes) - set(TUNABLE))
    if unknown:
        raise TuningError(f"unknown parameter(s): {', '.join(unknown)}; tunable: {', '.join(TUNABLE)}")
    updated = dict(current)
    for name, raw in changes.items():
        value = finite_number(raw, -math.inf, math.inf)
        if value is None:
            raise TuningError(f"{name} must be a number, finite, got {str(raw)[:32]!r}")
        refusal = bounds(name).refusal(name, value)
        if refusal is not None:
            raise TuningError(refusal)
        updated[name] = value
    try:
        params_from_values(updated, batch_size)
    except ValueError as error:
        raise TuningError(f"refused: {error} (with {_describe(updated)})") from error
    return updated


def _describe(values: Mapping[str, float]) -> str:
    return ", ".join(f"{name}={values[name]:g}" for name in TUNABLE)


class PolicyTuning:
    """Reads and changes the live policy parameters shared by every batcher."""

    def __init__(
        self,
        redis: RedisClient,
        keys: RedisKeys,
        defaults: Mapping[str, float],
        batch_size: int,
        model: str | None = None,
    ) -> None:
        """The policy of one model (None: the default model; see ``RedisKeys.model_policy``),
        whose calls take ``batch_size`` rows."""
        self._redis = redis
        self._key = keys.model_policy(model)
        self._history_key = keys.model_policy_history(model)
        self.defaults = dict(defaults)
        self.batch_size = batch_size

    @classmethod
    def from_settings(cls, settings: Settings, redis: RedisClient, model: str, batch_size: int) -> PolicyTuning:
        """The policy of ``model``, a model the settings serve."""
        return cls(
            redis,
            RedisKeys(settings.key_prefix),
            defaults_from_settings(settings),
            batch_size,
            settings.model_scope(model),
        )

    async def values(self) -> dict[str, float]:
        """Defaults overlaid with what was changed at run time."""
        stored = await self._redis.hgetall(self._key)
        values = dict(self.defaults)
        for name, raw in stored.items():
            key = as_text(name)
            if key in TUNABLE:
                values[key] = float(raw)
        return values

    async def params(self) -> PolicyParams:
        return params_from_values(await self.values(), self.batch_size)

    async def update(self, changes: Mapping[str, Any], actor: str = "") -> dict[str, Any]:
        """Validate and store a change atomically; returns ``{old, new, at_ms, actor}``."""
        async with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(self._key)
                    old = await self.values()
                    new = apply_changes(old, changes, self.batch_size)
                    entry = {"at_ms": now_ms(), "actor": actor, "old": old, "new": new}
                    pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
                    pipe.hset(self._key, mapping={name: repr(new[name]) for name in TUNABLE})
                    pipe.lpush(self._history_key, json.dumps(entry))
                    pipe.ltrim(self._history_key, 0, _HISTORY_LENGTH - 1)
                    await pipe.execute()
                    break
                except WatchError:
                    continue  # another change landed first: validate against it
        changed = {name: f"{old[name]:g} -> {new[name]:g}" for name in TUNABLE if old[name] != new[name]}
        log.info("policy changed", extra={"changes": changed, "actor": actor, "at_ms": entry["at_ms"]})
        return entry

    async def history(self, limit: int = 20) -> list[dict[str, Any]]:
        raw = await self._redis.lrange(self._history_key, 0, limit - 1)
        return [json.loads(item) for item in raw]
