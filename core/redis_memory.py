"""How full Redis is, so the API stops admitting work before Redis refuses writes.

A Redis that must keep its data runs with ``maxmemory`` and ``noeviction``: past the limit
every write is refused. The batchers must still store the results of tasks already
accepted, so the API refuses new work (503 ``store_full``, with Retry-After) once used
memory reaches ``redis_admission_memory_ratio`` of the limit, read every ``READ_S``; the
room left is the batchers'. A Redis without a limit is never called full.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from redis.exceptions import RedisError

from brimful.core.redis_client import RedisClient

log = logging.getLogger("brimful.store")

READ_S = 1.0


def is_full(info: Mapping[str, Any], ratio: float) -> bool:
    """Whether one node's ``INFO memory`` (or a cluster's, node by node) is past ``ratio``
    of its ``maxmemory``."""
    nodes = [node for node in info.values() if isinstance(node, Mapping)] or [info]
    return any(
        int(node.get("maxmemory", 0) or 0) > 0
        and int(node.get("used_memory", 0) or 0) >= ratio * int(node["maxmemory"])
        for node in nodes
    )


class RedisMemory:
    """Whether Redis is too full to admit work, kept up to date."""

    def __init__(self, redis: RedisClient, ratio: float) -> None:
        self._redis = redis
        self._ratio = ratio
        self.full = False

    async def run(self) -> None:
        """For the life of the process: read Redis's memory every ``READ_S``."""
        while True:
            try:
                full = is_full(await self._redis.info("memory"), self._ratio)
            except RedisError:
                full = self.full  # unreachable: the requests' own errors say so
            if full != self.full:
                log.warning("redis memory: admission %s", "paused" if full else "resumed")
            self.full = full
            await asyncio.sleep(READ_S)
