"""Following a Redis pub/sub channel for the life of a process, through Redis restarts."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from brimful.core.redis_client import RedisClient, is_cluster

log = logging.getLogger("brimful.pubsub")

RESUBSCRIBE_DELAY_S = 0.5


class _Reconnects:
    """Hears every reconnect of a subscription's connection. redis-py reconnects and
    re-subscribes by itself inside ``get_message``, without raising, so whatever was
    published while the connection was away is lost without a word: this says so."""

    def __init__(self, on_lost: Callable[[], None]) -> None:
        self._on_lost = on_lost

    async def connected(self, connection: object) -> None:
        self._on_lost()


async def follow_channel(
    redis: RedisClient,
    channel: str,
    on_message: Callable[[bytes], object],
    on_lost: Callable[[], None] = lambda: None,
    stop: asyncio.Event | None = None,
) -> None:
    """Hand every message published on ``channel`` to ``on_message`` until ``stop`` is set
    (or the task is cancelled). Whenever the subscription was interrupted (its connection
    failed, or was re-established under it), call ``on_lost``: messages may have been
    missed, so whoever waits on one must look again."""
    while stop is None or not stop.is_set():
        reconnects = _Reconnects(on_lost)  # held here: the connection keeps only a weak reference
        pubsub = None
        try:
            if is_cluster(redis):
                # A cluster's pub/sub picks its node from the slot map, read on first use.
                await redis.initialize()
            pubsub = redis.pubsub()
            await pubsub.subscribe(channel)
            # Registered after the subscription, so it runs after redis-py's own re-subscribe:
            # whoever re-reads on ``on_lost`` cannot miss a message published after that.
            assert pubsub.connection is not None  # subscribing connected it
            pubsub.connection.register_connect_callback(reconnects.connected)
            while stop is None or not stop.is_set():
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
                if message is not None and message["type"] == "message":
                    on_message(message["data"])
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.warning("subscription lost; resubscribing", extra={"channel": channel, "error": str(error)})
            on_lost()
            await asyncio.sleep(RESUBSCRIBE_DELAY_S)
        finally:
            if pubsub is not None:
                if pubsub.connection is not None:
                    pubsub.connection.deregister_connect_callback(reconnects.connected)
                await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
