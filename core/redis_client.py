"""The Redis client every Brimful process uses, configured from settings."""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError

from brimful.core.settings import Settings


def make_redis(settings: Settings) -> Redis:
    """A client whose pool makes a burst wait for a free connection (up to
    ``redis_pool_timeout_s``) instead of failing it, and which retries a command on a
    fresh connection when the old one died (Redis restarted)."""
    pool = BlockingConnectionPool.from_url(
        settings.redis_url,
        max_connections=settings.redis_max_connections,
        timeout=settings.redis_pool_timeout_s,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=3),
        retry_on_error=[ConnectionError, TimeoutError],
    )
    return Redis(connection_pool=pool)
