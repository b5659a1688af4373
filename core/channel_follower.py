"""Following a Redis pub/sub channel for the life of a process, through Redis restarts."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from redis.asyncio import Redis

log = logging.getLogger("brimful.pubsub")

RESUBSCRIBE_DELAY_S = 0.5


async def follow_channel(
    redis: Redis,
    channel: str,
    on_message: Callable[[bytes], None],
    on_lost: Callable[[], None] = lambda: None,
    stop: asyncio.Event | None = None,
) -> None:
    """Hand every message published on ``channel`` to ``on_message`` until ``stop`` is set
    (or the task is cancelled). When the subscription fails, call ``on_lost`` (messages may
    have been missed: whoever waits on one must look again) and subscribe afresh."""
    while stop is None or not stop.is_set():
        pubsub = redis.pubsub()
        try:
            await pubsub.subscribe(channel)
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
            await pubsub.aclose()
