"""The Redis client every Brimful process uses, configured from settings: one Redis, or
a Redis Cluster (``BRIMFUL_REDIS_CLUSTER``), its commands framed by hiredis.

redis-py's asyncio client frames every command in Python (its synchronous client uses
hiredis when installed): for the task store's scripts, whose arguments are a batch's 64
task ids and fields, that framing was the batcher's largest single cost in a profile at
saturation. ``HiredisPackingConnection`` frames the same bytes in C.

``follow_channel`` follows a pub/sub channel for the life of a process, through Redis
restarts, and says when messages may have been missed."""

from __future__ import annotations

import asyncio
import codecs
import logging
from collections.abc import Callable
from typing import Any, TypeAlias

import hiredis
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, DataError

from brimful.core.settings import Settings

log = logging.getLogger("brimful.redis")

RedisClient: TypeAlias = Redis | RedisCluster
"""Either client: the stores use only what both offer, and split their multi-key work by
hash slot where the client is a cluster's (``is_cluster``)."""


# Connections a cluster client may open to each node beyond the commands it runs at once:
# its pub/sub subscriptions hold theirs for good.
_SUBSCRIPTION_CONNECTIONS = 4


class WaitingRedisCluster(RedisCluster):
    """A cluster client on which a burst waits for a turn (up to ``pool_timeout_s``)
    instead of failing: redis-py's cluster client raises MaxConnectionsError as soon as a
    node's pool is spent. Each command or pipeline takes one turn and holds at most one
    connection per node, so ``max_concurrent`` turns never exceed a node's pool."""

    def __init__(self, *args: Any, max_concurrent: int, pool_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, max_connections=max_concurrent + _SUBSCRIPTION_CONNECTIONS, **kwargs)  # type: ignore[misc]
        self._turns = asyncio.Semaphore(max_concurrent)
        self._pool_timeout_s = pool_timeout_s

    async def take_turn(self) -> None:
        """Wait for a free turn; raises ConnectionError after ``pool_timeout_s``."""
        try:
            await asyncio.wait_for(self._turns.acquire(), self._pool_timeout_s)
        except TimeoutError:
            raise ConnectionError("no Redis connection became free in time") from None

    def end_turn(self) -> None:
        self._turns.release()

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        await self.take_turn()
        try:
            return await super().execute_command(*args, **kwargs)
        finally:
            self.end_turn()

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> ClusterPipeline:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # which refuses it
        return _WaitingPipeline(self, transaction)  # type: ignore[abstract]  # redis-py declares an attribute it sets as abstract


class _WaitingPipeline(ClusterPipeline):
    """A cluster pipeline that runs in one turn of its client."""

    def __init__(self, client: WaitingRedisCluster, transaction: Any | None = None) -> None:
        super().__init__(client, transaction)
        self._waiting_client = client

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        await self._waiting_client.take_turn()
        try:
            return await super().execute(raise_on_error, allow_redirections)
        finally:
            self._waiting_client.end_turn()


def as_text(reply: bytes | str) -> str:
    """A reply as text. Brimful's clients answer bytes (responses are not decoded: stored
    results are bytes), which redis-py's types cannot tell from a decoding client's."""
    return reply.decode() if isinstance(reply, bytes) else reply


def is_cluster(redis: RedisClient) -> bool:
    """Whether keys in different hash slots must go in different commands."""
    return isinstance(redis, RedisCluster)


def make_redis(settings: Settings) -> RedisClient:
    """A client that retries a command on a fresh connection when the old one died (Redis
    restarted), and fails one that gets no answer within ``redis_timeout_s`` (connecting
    included) without repeating it: it may have run, and a paused Redis must hold no
    request for long. TCP keepalive finds a peer that vanished. On one Redis its pool
    makes a burst wait for a free connection (up to ``redis_pool_timeout_s``) instead of
    failing it; on a cluster, the same holds for ``redis_max_connections`` commands at
    once, and the client follows the slot map."""
    # Only a dead connection is tried again: redis-py's default would repeat a timed-out command too.
    retry = Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=3, supported_errors=(ConnectionError,))
    timeouts: dict[str, Any] = {
        "socket_timeout": settings.redis_timeout_s,
        "socket_connect_timeout": settings.redis_timeout_s,
        "socket_keepalive": True,
    }
    if settings.redis_cluster:
        return WaitingRedisCluster.from_url(
            settings.redis_url,
            max_concurrent=settings.redis_max_connections,
            pool_timeout_s=settings.redis_pool_timeout_s,
            retry=retry,
            retry_on_error=[ConnectionError],
            **timeouts,
        )
    pool = BlockingConnectionPool.from_url(
        settings.redis_url,
        # hiredis frames the commands; a rediss:// or unix:// URL names its own connection class, which wins.
        connection_class=HiredisPackingConnection,
        max_connections=settings.redis_max_connections,
        timeout=settings.redis_pool_timeout_s,
        retry=retry,
        retry_on_error=[ConnectionError],
        **timeouts,
    )
    return Redis(connection_pool=pool)


_AS_IS = frozenset({bytes, str, int, float})
_NUMBERS_AND_BYTES = frozenset({bytes, int, float})


class HiredisPackingConnection(Connection):
    """A connection whose commands hiredis frames: the wire format is redis-py's, byte for
    byte. hiredis writes bytes, ints and floats as redis-py's encoder does, and text as
    UTF-8 (strict); anything else, and text under another encoding, goes through the
    connection's own encoder first."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        utf8 = codecs.lookup(self.encoder.encoding).name == "utf-8" and self.encoder.encoding_errors == "strict"
        self._as_is = _AS_IS if utf8 else _NUMBERS_AND_BYTES

    def pack_command(self, *args: Any) -> list[bytes]:
        name = args[0]
        # A command named with its subcommand ("CONFIG GET") goes as two arguments, as redis-py sends it.
        if isinstance(name, str):
            args = (*name.encode().split(), *args[1:])
        elif b" " in name:
            args = (*name.split(), *args[1:])
        as_is = self._as_is
        # A bool, which redis-py refuses, is not as is; a set of the types is checked in C
        # (a script's 200 arguments: 3.7 against 8.5 us for a generator's test of each).
        if not as_is.issuperset(map(type, args)):
            encode: Callable[[object], bytes | memoryview] = self.encoder.encode
            args = tuple(arg if type(arg) in as_is else bytes(encode(arg)) for arg in args)
        try:
            return [hiredis.pack_command(args)]
        except TypeError as error:
            raise DataError(str(error)) from error


RESUBSCRIBE_DELAY_S = 0.5  # after a subscription failed, before following it again


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
