"""The embedded stack's settings for a load benchmark, and the key its load carries.

Two shapes. The open one (a study of one mechanism): no auth, no rate limit, no in-flight
quota and no backlog limit, the benchmark being the only client and meaning to push. The
production one (``production=True``: ``make bench``, the sustained and scale runs): auth on,
each request carrying a key (``api_key``), and the tenant's limits on as an operator sets
them for a large tenant: rates far above what the run offers, so the limiters' work is paid
on every request and never binds, and the default quota of tasks in flight. Both keep
results ten minutes and serve the model with ``instances`` instances and one more slot that
queues the next call behind them."""

from __future__ import annotations

import asyncio

from bench.harness.throughput_plan import API_WORKERS, BenchModel
from brimful.core.api_keys import ApiKeys, Scope
from brimful.core.redis_client import make_redis
from brimful.core.redis_keys import RedisKeys
from brimful.core.settings import Settings
from brimful.stack import EmbeddedStack, settings_on_free_ports

# A large tenant's allowance, a second: far above any rate a run here offers.
PRODUCTION_TENANT_RATE = 100_000
PRODUCTION_LIMITS: dict[str, object] = {
    "auth_enabled": True,
    "rate_limit_per_s": PRODUCTION_TENANT_RATE,
    "rate_limit_burst": PRODUCTION_TENANT_RATE,
    "read_rate_limit_per_s": PRODUCTION_TENANT_RATE,
    "read_rate_limit_burst": PRODUCTION_TENANT_RATE,
}
OPEN_LIMITS: dict[str, object] = {"rate_limit_per_s": 0, "tenant_max_in_flight": 0, "max_backlog": 10_000_000}
BENCH_TENANT = "bench"

_keys: dict[str, str] = {}  # the key made for each stack, by its API's URL


def load_settings(
    model: BenchModel, api_workers: int = API_WORKERS, instances: int = 1, production: bool = False, **overrides: object
) -> Settings:
    """Settings on free ports for a load benchmark of ``model``; ``overrides`` win."""
    values: dict[str, object] = {
        **(PRODUCTION_LIMITS if production else OPEN_LIMITS),
        "result_ttl_s": 600,
        "api_workers": api_workers,
        "model_name": model.model_name,
        "endpoint_instances": instances,
        "endpoint_capacity": instances + 1,
    }
    return settings_on_free_ports(**{**values, **overrides})


def api_key(stack: EmbeddedStack) -> str:
    """The key the benchmark's requests carry on ``stack`` ("" where auth is off): one of
    every scope for the bench tenant, made on first use, as `brimful keys create` makes it."""
    if not stack.settings.auth_enabled:
        return ""
    if stack.api_url not in _keys:
        _keys[stack.api_url] = asyncio.run(_create(stack.settings))
    return _keys[stack.api_url]


async def _create(settings: Settings) -> str:
    redis = make_redis(settings)
    try:
        key, _ = await ApiKeys(redis, RedisKeys(settings.key_prefix)).create(BENCH_TENANT, list(Scope), "bench")
        return key
    finally:
        await redis.aclose()
