"""The model pool with its I/O: a Triton client per endpoint, slots leased across
batchers, endpoint names re-resolved, probes while every circuit is open.

The decisions are ``EndpointPool``'s (pure); this class turns them into connections and
waits. A batch holds one slot from dispatch to its last stored result and makes its calls
there one at a time; a transient failure moves it to another endpoint (``switch``).

``EndpointLeases``: slots of a model endpoint leased in Redis, so that several batchers
sharing endpoints never send one more concurrent calls than its capacity.

A lease is a member of the endpoint's sorted set, scored by when it expires on Redis's
own clock (batchers' clocks may differ). Taking one drops expired leases first, so a
batcher that died holding slots gives them back within ``ttl_s``; a lease outlives the
longest call it covers."""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import socket
import time
import uuid
from collections.abc import Awaitable, Callable

from brimful.core import metrics
from brimful.core.pool_capacity import PoolCapacity
from brimful.core.redis_client import RedisClient
from brimful.core.redis_keys import RedisKeys
from brimful.workers.endpoint_pool import BreakerState, Endpoint, EndpointPool
from brimful.workers.slot import NoSlotInTime, Slot
from brimful.workers.triton_model import TritonModel

log = logging.getLogger("brimful.worker")

Resolver = Callable[[str, int], Awaitable[list[str]]]

GIVE_BACK_WAIT_S = 2.0  # the most close() waits for leases on their way back; the rest expire
_BREAKER_LEVEL = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}


async def resolve_all(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, as ``address:port`` (a headless Service's pods)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = str(sockaddr[0])
        addresses.append(f"[{address}]:{port}" if ":" in address else f"{address}:{port}")
    return sorted(set(addresses))


class ModelPool:
    """Endpoints to call, chosen by ``EndpointPool``."""

    def __init__(
        self,
        configured: list[str],
        pool: EndpointPool,
        connect: Callable[[str], TritonModel],
        batch_size: int,
        leases: EndpointLeases | None = None,
        resolve: Resolver | None = None,
        resolve_every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        lease_retry_s: float = 0.005,
        probe_timeout_s: float = 2.0,
        slot_wait_s: float = 60.0,
    ) -> None:
        """``slot_wait_s``: the longest ``acquire`` waits for a slot while some endpoint
        serves (an outage, every circuit open, is bounded by the runner's give-up instead)."""
        self.configured = list(configured)
        self.pool = pool
        self.batch_size = batch_size
        self._connect = connect
        self._leases = leases
        self._resolve = resolve
        self._resolve_every_s = resolve_every_s
        self._clock = clock
        self._lease_retry_s = lease_retry_s
        self._probe_timeout_s = probe_timeout_s  # a readiness answer takes milliseconds; a hung endpoint is down
        self._slot_wait_s = slot_wait_s
        self.moved_at = clock()  # when a slot was last taken or given back (a stall shows here)
        self._models: dict[str, TritonModel] = {}
        self._changed = asyncio.Event()  # a slot freed or the endpoints changed
        # The calls of ``acquire`` waiting for a slot, first come first served: a batch that
        # gives its slot back and wants one again (the next call isolating a failing row)
        # takes its turn behind them, and so does a new batch (``reserve``).
        self._waiting: collections.deque[int] = collections.deque()
        self._tickets = itertools.count()
        self._giving_back: set[asyncio.Task[None]] = set()  # leases given back in the background
        # Told when this pool opens an endpoint's circuit, so other batchers can hear it.
        self.on_opened: Callable[[str], None] | None = None
        self._sync(self.configured if resolve is None else [])

    # --- membership --------------------------------------------------------------------

    def _sync(self, urls: list[str]) -> None:
        added, retired = self.pool.sync(urls)
        for url in added:
            if url not in self._models:
                self._models[url] = self._connect(url)
            metrics.ENDPOINT_CAPACITY.labels(url).set(self.pool.endpoints[url].capacity)
        if added or retired:
            log.info(
                "model endpoints changed",
                extra={"added": added, "retired": retired, "endpoints": sorted(self.pool.endpoints)},
            )
        self._changed.set()

    async def _drop_retired(self) -> None:
        for url in self.pool.drop_idle_retired():
            model = self._models.pop(url, None)
            for gauge in (
                metrics.ENDPOINT_CAPACITY,
                metrics.IN_FLIGHT,
                metrics.ENDPOINT_BREAKER,
                metrics.ENDPOINT_CALL_SECONDS,
            ):
                try:
                    gauge.remove(url)
                except KeyError:
                    pass
            if model is not None:
                await model.close()

    async def refresh(self) -> None:
        """Re-resolve the configured names (with a resolver) and adopt the result. A name
        that fails to resolve keeps its last addresses; nothing resolved keeps all."""
        if self._resolve is None:
            self._sync(self.configured)
        else:
            urls: list[str] = []
            for entry in self.configured:
                host, _, port = entry.rpartition(":")
                try:
                    urls.extend(await self._resolve(host.strip("[]"), int(port)))
                except Exception as error:
                    log.warning("could not resolve a model endpoint", extra={"endpoint": entry, "error": repr(error)})
                    urls.extend(url for url in self.pool.endpoints if not self.pool.endpoints[url].retired)
            if urls:
                self._sync(urls)
        await self._drop_retired()

    async def keep_resolved(self, stop: asyncio.Event) -> None:
        """Refresh every ``resolve_every_s`` until ``stop``."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self._resolve_every_s)
            except TimeoutError:
                pass
            if not stop.is_set():
                await self.refresh()

    # --- slots -------------------------------------------------------------------------

    def capacity(self) -> PoolCapacity:
        """What the flush policy may count on now."""
        return self.pool.capacity(self._clock(), self.batch_size)

    @property
    def healthy(self) -> bool:
        """False while every endpoint's circuit is open: the batcher stops consuming."""
        return self.pool.healthy(self._clock())

    def reserve(self, rows: int) -> Slot | None:
        """Take a slot now, without waiting, if one is free and no batch waits for one in
        ``acquire`` (those are served first): the batcher's dispatch."""
        return None if self._waiting else self._take(rows)

    def _take(self, rows: int) -> Slot | None:
        now = self._clock()
        endpoint = self.pool.reserve(now, rows)
        if endpoint is None:
            return None
        self._mark(endpoint)
        self.moved_at = now
        return Slot(endpoint, self._models[endpoint.url], now, uuid.uuid4().hex)

    async def acquire(self, rows: int) -> Slot:
        """A slot, waiting for one (slots free as calls return; the batcher stops consuming
        while every circuit is open), first come first served. Raises NoSlotInTime once no
        slot was taken or given back for ``slot_wait_s`` while some endpoint serves: every
        call is bounded by its timeout, so slots that do not move are held by something that
        will not give them back (slots that move but go to others first are no stall)."""
        ticket = next(self._tickets)
        self._waiting.append(ticket)
        waiting_since = self._clock()
        try:
            while True:
                if self._waiting[0] == ticket:
                    slot = self._take(rows)
                    if slot is not None:
                        return slot
                now = self._clock()
                if not self.healthy:
                    waiting_since = now  # an outage: bounded by transient_give_up_s, not here
                elif now - max(waiting_since, self.moved_at) > self._slot_wait_s:
                    raise NoSlotInTime(f"no model slot was taken or given back in {self._slot_wait_s:g} s")
                self._changed.clear()
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout=self._seconds_to_retry())
                except TimeoutError:
                    pass
        finally:
            self._waiting.remove(ticket)
            self._changed.set()  # the next in line looks now

    @property
    def leasing(self) -> bool:
        """Whether slots are leased across batchers (a round trip to Redis before a call)."""
        return self._leases is not None

    async def try_lease(self, slot: Slot) -> bool:
        """One attempt to lease ``slot`` across batchers before its rows leave the
        accumulator: True once leased (or with no leasing). False when other batchers hold
        every slot of its endpoint: the slot is freed here and the endpoint counted full for
        a moment, so the batch keeps filling instead of waiting outside the accumulator.
        Cancelled, the slot is given back; Redis failing, it raises with the slot still held
        here, unleased (``SlotLeasing`` lets its batch go; the call's ``secure`` tries again)."""
        if self._leases is None or slot.leased:
            return True
        try:
            taken = await self._leases.take(slot.endpoint.url, slot.endpoint.capacity, slot.holder)
        except asyncio.CancelledError:
            self.abandon(slot)
            raise
        if taken:
            slot.leased = True
            return True
        now = self._clock()
        self.pool.held_elsewhere(slot.endpoint, now, now + self._lease_retry_s)
        self._free(slot)
        return False

    async def secure(self, slot: Slot, rows: int) -> Slot:
        """The slot, leased across batchers; if other batchers hold every slot of its
        endpoint, another one (waiting if need be). Should it raise or be cancelled, it
        holds no slot: the one it was given and any it moved to are given back here (a
        slot the caller never saw, as ``switch``'s, would otherwise stay taken for good)."""
        try:
            while not await self.try_lease(slot):  # refused: freed here, so wait for another
                slot = await self.acquire(rows)
        except BaseException:
            self.abandon(slot)  # freeing twice frees once
            raise
        return slot

    def call_begins(self, slot: Slot, rows: int, handoff_s: float | None = None) -> None:
        """The call on ``slot`` is sent now with ``rows`` real rows; ``handoff_s``: how long
        after its batch's flush (the first call of a batch only)."""
        if slot.freed:
            return
        slot.held_since = self.pool.call_began(slot.endpoint, slot.held_since, self._clock(), rows)
        if handoff_s is not None:
            self.pool.observe_handoff(handoff_s)

    def record_call(self, slot: Slot, started_at: float, rows: int, transient_failure: bool) -> None:
        """What a call on ``slot`` came to (its breaker and call time hear it)."""
        now = self._clock()
        was = slot.endpoint.breaker.state(now)
        self.pool.record_call(slot.endpoint, started_at, now, rows, transient_failure)
        state = slot.endpoint.breaker.state(now)
        metrics.ENDPOINT_BREAKER.labels(slot.endpoint.url).set(_BREAKER_LEVEL[state])
        if was is BreakerState.CLOSED and state is BreakerState.OPEN and self.on_opened is not None:
            self.on_opened(slot.endpoint.url)
        if not transient_failure:
            metrics.ENDPOINT_CALL_SECONDS.labels(slot.endpoint.url).set(
                slot.endpoint.call_time.predict(self.batch_size)
            )

    def release(self, slot: Slot) -> None:
        """Give the slot back: here at once, and its lease, if any, to Redis in the
        background (never raises), so a call's results do not wait a round trip for it.
        The lease's holder name is the slot's own: a late give-back frees only that lease."""
        self._free(slot)
        if slot.leased:
            slot.leased = False
            self._give_back_later(slot)

    def abandon(self, slot: Slot) -> None:
        """Give back a slot whose lease is in doubt (a take cut short): locally now, and
        any lease in its holder's name in the background, without waiting (safe while being
        cancelled). A take that lands after the give-back holds its lease until it expires."""
        self._free(slot)
        slot.leased = False
        self._give_back_later(slot)

    def _give_back_later(self, slot: Slot) -> None:
        if self._leases is not None:
            task = asyncio.ensure_future(self._leases.give_back(slot.endpoint.url, slot.holder))
            self._giving_back.add(task)
            task.add_done_callback(self._giving_back.discard)

    async def switch(self, slot: Slot, rows: int) -> Slot:
        """After a transient failure: give the slot back and take another, which
        ``EndpointPool.choose`` places away from the endpoint that failed where it can."""
        self.release(slot)
        return await self.secure(await self.acquire(rows), rows)

    def can_switch_now(self) -> bool:
        """Whether another endpoint could take the call at once (else back off first)."""
        return self.pool.capacity(self._clock(), self.batch_size).free_slots > 0

    def _free(self, slot: Slot) -> None:
        if slot.freed:
            return
        slot.freed = True
        self.moved_at = self._clock()
        self.pool.release(slot.endpoint, slot.held_since)
        metrics.IN_FLIGHT.labels(slot.endpoint.url).set(slot.endpoint.in_flight)
        self._changed.set()

    def _mark(self, endpoint: Endpoint) -> None:
        metrics.IN_FLIGHT.labels(endpoint.url).set(endpoint.in_flight)

    def _seconds_to_retry(self) -> float:
        now = self._clock()
        waits = [0.25]
        for endpoint in self.pool.endpoints.values():
            if endpoint.retired:
                continue
            if now < endpoint.busy_elsewhere_until:
                waits.append(endpoint.busy_elsewhere_until - now)
            elif endpoint.breaker.state(now) is BreakerState.OPEN:
                waits.append(endpoint.breaker.seconds_until_allowed(now))
        return max(0.001, min(waits))

    # --- health ------------------------------------------------------------------------

    @property
    def some_circuit_open(self) -> bool:
        """Whether an endpoint is out of the pool for failing (a probe may bring it back)."""
        now = self._clock()
        return any(
            not e.retired and e.breaker.state(now) is not BreakerState.CLOSED for e in self.pool.endpoints.values()
        )

    @property
    def probe_due(self) -> bool:
        """Whether an endpoint out of the pool would let a probe through now."""
        now = self._clock()
        return any(
            not e.retired and e.breaker.state(now) is not BreakerState.CLOSED and e.breaker.would_allow(now)
            for e in self.pool.endpoints.values()
        )

    def trip(self, url: str) -> bool:
        """Open ``url``'s circuit here on news that another batcher's opened (its own
        failed calls would tell this one later). Unknown or already open: nothing."""
        endpoint = self.pool.endpoints.get(url)
        now = self._clock()
        if endpoint is None or endpoint.retired or not endpoint.breaker.trip(now):
            return False
        metrics.ENDPOINT_BREAKER.labels(url).set(_BREAKER_LEVEL[endpoint.breaker.state(now)])
        log.warning("model endpoint's circuit opened on another batcher's news", extra={"endpoint": url})
        self._changed.set()
        return True

    async def probe(self) -> None:
        """Ask each endpoint whose breaker lets a probe through whether it serves again, all
        at once and each for at most ``probe_timeout_s`` (a readiness check, not a call): an
        endpoint that hangs must not hold back the news that another is back. The batcher
        calls this while a circuit is open and nothing else would find out (consumption
        paused for an outage, or the pool steering every batch elsewhere)."""
        now = self._clock()
        due = [
            endpoint
            for endpoint in list(self.pool.endpoints.values())
            if not endpoint.retired
            and endpoint.breaker.state(now) is not BreakerState.CLOSED
            and endpoint.breaker.allow(now)
        ]
        await asyncio.gather(*(self._probe_one(endpoint) for endpoint in due))
        self._changed.set()

    async def _probe_one(self, endpoint: Endpoint) -> None:
        model = self._models.get(endpoint.url)
        try:
            ready = model is not None and await asyncio.wait_for(
                model.is_ready(), timeout=min(model.timeout_s, self._probe_timeout_s)
            )
        except TimeoutError:
            ready = False
        if ready:
            endpoint.breaker.record_success()
        else:
            endpoint.breaker.record_failure(self._clock())
        metrics.ENDPOINT_BREAKER.labels(endpoint.url).set(_BREAKER_LEVEL[endpoint.breaker.state(self._clock())])
        log.info("probed a model endpoint", extra={"endpoint": endpoint.url, "ready": ready})

    def summary(self) -> list[dict[str, object]]:
        """Each endpoint: in flight, capacity, call time, breaker, calls, rows."""
        return self.pool.summary(self._clock(), self.batch_size)

    def any_model(self) -> TritonModel:
        """A client of some endpoint (the model's metadata is the same on all)."""
        return self._models[next(iter(self.pool.endpoints))]

    async def close(self) -> None:
        """Close the model clients, once the leases given back meanwhile have reached Redis
        (a stopping batcher must not hold slots other batchers wait for until they expire)."""
        if self._giving_back:
            await asyncio.wait(set(self._giving_back), timeout=GIVE_BACK_WAIT_S)
        for model in self._models.values():
            await model.close()
        self._models.clear()


# KEYS[1]: the endpoint's leases. ARGV: holder, capacity, ttl_ms. Returns 1 if leased.
_TAKE_LUA = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now_ms + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
"""


class EndpointLeases:
    """Takes and gives back leases on endpoint slots."""

    def __init__(self, redis: RedisClient, keys: RedisKeys, ttl_s: float, model: str | None = None) -> None:
        """Leases on the slots of one model (None: the default model)."""
        self._redis = redis
        self._keys = keys
        self._model = model
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self._take = redis.register_script(_TAKE_LUA)

    async def take(self, endpoint: str, capacity: int, holder: str) -> bool:
        """Lease one of ``endpoint``'s ``capacity`` slots for ``holder``; False if all are held."""
        key = self._keys.endpoint_slots(endpoint, self._model)
        return bool(await self._take(keys=[key], args=[holder, capacity, self._ttl_ms]))

    async def give_back(self, endpoint: str, holder: str) -> None:
        """Release ``holder``'s lease. Never raises: a lease not given back expires."""
        try:
            await self._redis.zrem(self._keys.endpoint_slots(endpoint, self._model), holder)
        except Exception as error:
            log.warning(
                "could not give an endpoint slot back; it expires", extra={"endpoint": endpoint, "error": repr(error)}
            )

    async def held(self, endpoint: str) -> int:
        """Leases held now on ``endpoint`` (expired ones included until the next take)."""
        return int(await self._redis.zcard(self._keys.endpoint_slots(endpoint, self._model)))
