"""Webhooks in Redis: each tenant's endpoints (URL, events, secret), and every delivery,
from the event that made it to its last attempt.

An event becomes one delivery per endpoint of its tenant that takes its type. A delivery's
id is derived from the event's and the endpoint's, so an event emitted twice (a step run
again after a crash) is delivered once: at least once, never twice for one emission. Due
deliveries wait in one sorted set by the time of their next attempt; a sender claims a few
by moving them a lease ahead (``claim_due``), so a sender that dies leaves them due again.
Each tenant's deliveries are listed newest first (the last ``LOG_KEEP``), the dead ones
apart, for on-call to read and replay. Every webhook key shares one hash slot, so each of
these steps is one script or transaction on a Redis Cluster too.

Webhook events of finished tasks (``TaskEvents``): ``task.completed``, ``task.failed``, ``task.expired``,
for the tenants with an endpoint that takes them.

After each batch the runner announces its tasks that are final, the ones it finished and
the ones it found finished already (a record read again after a crash). An event's
deliveries take ids derived from the task and its state (above), so announcing again
makes none: a batcher that dies between storing a result and announcing
it is followed by one that reads the record again and announces it then. At least once.
Each tenant's endpoints are read once and kept, and read again whenever any endpoint
changed (one read of a counter a batch), so a task finished after its tenant registered an
endpoint is announced.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson

from brimful.core.redis_client import RedisClient, as_text
from brimful.core.redis_keys import RedisKeys
from brimful.core.task_record import TaskStatus, task_record_answer
from brimful.core.task_store import TaskStore
from brimful.core.webhook_signing import derived_secret, new_secret
from brimful.core.webhook_targets import origin
from brimful.schemas import TaskRequest

ENDPOINT_DISABLED = "webhook_endpoint.disabled"  # told to the tenant's other endpoints that take it
EVENT_TYPES = (
    "task.completed",
    "task.failed",
    "task.expired",
    "batch.completed",
    "batch.failed",
    "batch.expired",
    "batch.cancelled",
    ENDPOINT_DISABLED,
)
MAX_ENDPOINTS = 16  # a tenant's
CALLBACK = "callback"  # the endpoint id of a delivery to a task's own callback_url
# What an endpoint's deliveries carry: the whole event, or a thin one (``thin_data``), as
# Standard Webhooks recommends for payloads that may be large.
FULL, THIN = "full", "thin"
PAYLOADS = (FULL, THIN)
THIN_TASK_FIELDS = ("task_id", "model", "status", "submitted_at_ms", "updated_at_ms")
LOG_KEEP = 1000  # deliveries listed per tenant
FINAL_TTL_S = 7 * 24 * 3600  # a delivered or dead delivery's record

# KEYS: the delivery's record, the due set, the tenant's log. ARGV: its id, when it is due
# (ms), then the record's (field, value) pairs. Stores a delivery not made before, due then
# and listed, in one step; returns the log's length after it (0 if it made none).
_EMIT_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
return redis.call('ZCARD', KEYS[3])
"""
TRIM_SLACK = 100  # deliveries a tenant's log may pass LOG_KEEP by before its oldest are removed

# KEYS[1]: an endpoint's record. ARGV: a hash command (HSET or HSETNX) and its arguments,
# run only while the endpoint exists (a write never makes a part of a deleted one).
# Returns the command's answer, or false when the endpoint is gone.
_IF_ENDPOINT_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
return redis.call(ARGV[1], KEYS[1], unpack(ARGV, 2))
"""

# KEYS[1]: an endpoint's hash. ARGV: now (ms). Starts its failing spell unless one is on
# and returns the spell's start; 0 if the endpoint is gone. One round trip a failed attempt.
_NOTE_FAILURE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSETNX', KEYS[1], 'failing_since_ms', ARGV[1])
return tonumber(redis.call('HGET', KEYS[1], 'failing_since_ms'))
"""

# KEYS[1]: the due set. ARGV: now (ms), most to claim, the lease's end (ms). Moves up to
# that many due deliveries to the lease's end and returns their ids.
_CLAIM_LUA = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  redis.call('ZADD', KEYS[1], ARGV[3], id)
end
return ids
"""


def new_endpoint_id() -> str:
    return f"we_{secrets.token_hex(12)}"


def event_object_id(event_id: str) -> str:
    """The ``id`` an event's body carries (``evt_...``, as OpenAI's events): the same for
    every endpoint it goes to, and for the event emitted again."""
    return "evt_" + hashlib.sha256(event_id.encode()).hexdigest()[:24]


def event_body(event_id: str, event_type: str, data: Mapping[str, Any], now_ms: int) -> bytes:
    """A delivery's body: Standard Webhooks' ``type``, ``timestamp`` and ``data``, OpenAI's
    ``id``, ``object`` and ``created_at`` beside them."""
    return orjson.dumps(
        {
            "id": event_object_id(event_id),
            "object": "event",
            "created_at": now_ms // 1000,
            "type": event_type,
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_ms / 1000)),
            "data": data,
        }
    )


def thin_data(event_type: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """What a thin payload carries of an event's ``data``: a task event its task's id,
    model, status and times (the receiver reads the outputs or error with
    ``GET /v1/tasks/{id}``); any other event, small already, all of it."""
    if event_type not in TASK_EVENTS:
        return dict(data)
    return {name: data[name] for name in THIN_TASK_FIELDS if name in data}


def delivery_id(event_id: str, endpoint_id: str) -> str:
    """The same for one event and endpoint, whoever emits it and how often."""
    return "msg_" + hashlib.sha256(f"{event_id}|{endpoint_id}".encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Endpoint:
    endpoint_id: str
    tenant: str
    url: str
    events: tuple[str, ...]
    secret: str
    description: str
    created_at: int
    previous_secret: str = ""  # the secret before a rotation, still signing until previous_until
    previous_until: int = 0  # unix seconds
    disabled: str = ""  # why it is disabled; "": enabled
    failing_since_ms: int = 0  # since when its deliveries have failed, none delivered since (0: not failing)
    payload: str = FULL  # FULL or THIN (``thin_data``)

    def signing_secrets(self, now_s: float) -> list[str]:
        """The secrets a delivery is signed with now: during a rotation, the new and the old."""
        keep_old = self.previous_secret and now_s < self.previous_until
        return [self.secret, self.previous_secret] if keep_old else [self.secret]

    def shown(self, with_secret: bool = False) -> dict[str, Any]:
        """As the API shows it; the secret only when it is made (or rotated)."""
        answer: dict[str, Any] = {
            "id": self.endpoint_id,
            "url": self.url,
            "events": list(self.events),
            "description": self.description,
            "created_at": self.created_at,
            "payload": self.payload,
            "disabled": bool(self.disabled),
            "disabled_reason": self.disabled or None,
            "failing_since_ms": self.failing_since_ms or None,
            "previous_secret_valid_until": self.previous_until or None,
        }
        if with_secret:
            answer["secret"] = self.secret
        return answer


@dataclass
class Delivery:
    delivery_id: str
    tenant: str
    endpoint_id: str
    event_type: str
    payload: bytes
    created_at_ms: int
    state: str = "pending"  # pending, delivered, dead
    attempts: int = 0
    last_status: int = 0  # the receiver's HTTP status (0: no answer)
    last_error: str = ""
    next_at_ms: int = 0
    url: str = ""  # a task's callback_url (endpoint_id CALLBACK); empty: its endpoint's URL

    def shown(self) -> dict[str, Any]:
        return {
            "id": self.delivery_id,
            "endpoint_id": self.endpoint_id,
            "event_type": self.event_type,
            "state": self.state,
            "attempts": self.attempts,
            "last_status": self.last_status or None,
            "last_error": self.last_error or None,
            "created_at_ms": self.created_at_ms,
            "next_attempt_at_ms": self.next_at_ms if self.state == "pending" else None,
        }


class WebhookRecords:
    """Endpoints and deliveries; another tenant's read as none."""

    def __init__(self, redis: RedisClient, keys: RedisKeys) -> None:
        self._redis = redis
        self._keys = keys
        self._claim = redis.register_script(_CLAIM_LUA)
        self._emit = redis.register_script(_EMIT_LUA)
        self._if_endpoint = redis.register_script(_IF_ENDPOINT_LUA)
        self._note_failure = redis.register_script(_NOTE_FAILURE_LUA)

    # --- endpoints ------------------------------------------------------------------------

    async def add_endpoint(self, endpoint: Endpoint) -> bool:
        """Store it; False when the tenant already has ``MAX_ENDPOINTS``."""
        index = self._keys.webhook_endpoints(endpoint.tenant)
        if await self._redis.scard(index) >= MAX_ENDPOINTS:
            return False
        fields: dict[Any, Any] = {
            "tenant": endpoint.tenant,
            "url": endpoint.url,
            "events": ",".join(endpoint.events),
            "secret": endpoint.secret,
            "description": endpoint.description,
            "created_at": endpoint.created_at,
            "payload": endpoint.payload,
        }
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._keys.webhook_endpoint(endpoint.endpoint_id), mapping=fields)
            pipe.sadd(index, endpoint.endpoint_id)
            pipe.incr(self._keys.webhook_endpoints_version)
            await pipe.execute()
        return True

    async def endpoints_version(self) -> int:
        """A number that changes whenever any tenant's endpoints do: a reader that holds
        endpoints knows when to read them again."""
        return int(await self._redis.get(self._keys.webhook_endpoints_version) or 0)

    async def endpoint(self, endpoint_id: str, tenant: str | None = None) -> Endpoint | None:
        raw = await self._redis.hgetall(self._keys.webhook_endpoint(endpoint_id))
        if not raw:
            return None
        fields = {as_text(k): as_text(v) for k, v in raw.items()}
        found = Endpoint(
            endpoint_id,
            fields["tenant"],
            fields["url"],
            tuple(event for event in fields["events"].split(",") if event),
            fields["secret"],
            fields.get("description", ""),
            int(fields["created_at"]),
            fields.get("previous_secret", ""),
            int(fields.get("previous_until", 0)),
            fields.get("disabled", ""),
            int(fields.get("failing_since_ms", 0)),
            fields.get("payload", FULL),
        )
        return found if tenant is None or found.tenant == tenant else None

    async def rotate_secret(self, endpoint: Endpoint, overlap_s: float) -> Endpoint:
        """A new secret for the endpoint; the old one signs beside it for ``overlap_s``."""
        rotated = dataclasses.replace(
            endpoint,
            secret=new_secret(),
            previous_secret=endpoint.secret,
            previous_until=int(time.time() + overlap_s),
        )
        fields = {
            "secret": rotated.secret,
            "previous_secret": rotated.previous_secret,
            "previous_until": rotated.previous_until,
        }
        await self._if_endpoint(
            keys=[self._keys.webhook_endpoint(endpoint.endpoint_id)], args=["HSET", *_pairs(fields)]
        )
        return rotated

    async def disable(self, endpoint: Endpoint, reason: str) -> bool:
        """Disable the endpoint, naming why; False if it was disabled already (or is gone)."""
        key = self._keys.webhook_endpoint(endpoint.endpoint_id)
        if not await self._if_endpoint(keys=[key], args=["HSETNX", "disabled", reason[:300]]):
            return False
        await self._redis.incr(self._keys.webhook_endpoints_version)
        return True

    async def enable(self, endpoint: Endpoint) -> None:
        """Deliver to it again; its failing spell starts afresh."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self._keys.webhook_endpoint(endpoint.endpoint_id), "disabled", "failing_since_ms")
            pipe.incr(self._keys.webhook_endpoints_version)
            await pipe.execute()

    async def note_failure(self, endpoint_id: str, now_ms: int) -> int:
        """A delivery to the endpoint failed: since when its deliveries have failed (now,
        unless a spell is on already); 0 if it is gone."""
        return int(await self._note_failure(keys=[self._keys.webhook_endpoint(endpoint_id)], args=[now_ms]) or 0)

    async def note_success(self, endpoint_id: str) -> None:
        """A delivery to the endpoint was delivered: it is not failing."""
        await self._redis.hdel(self._keys.webhook_endpoint(endpoint_id), "failing_since_ms")

    async def endpoints(self, tenant: str) -> list[Endpoint]:
        ids = sorted(as_text(cast(bytes, i)) for i in await self._redis.smembers(self._keys.webhook_endpoints(tenant)))
        found = [await self.endpoint(endpoint_id, tenant) for endpoint_id in ids]
        return sorted((e for e in found if e is not None), key=lambda e: e.created_at)

    async def callback_secret(self, tenant: str, url: str) -> str:
        """The secret that signs the tenant's deliveries to tasks' callback URLs of ``url``'s
        origin: derived from the tenant's callback master secret (made on first use, never
        shown), so each receiver holds its own. TargetRefused for a URL no callback may take."""
        scope = origin(url)
        key = self._keys.webhook_callback_secret(tenant)
        await self._redis.set(key, new_secret(), nx=True)
        return derived_secret(as_text(await self._redis.get(key) or b""), scope)

    async def remove_endpoint(self, endpoint: Endpoint) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._keys.webhook_endpoint(endpoint.endpoint_id))
            pipe.srem(self._keys.webhook_endpoints(endpoint.tenant), endpoint.endpoint_id)
            pipe.incr(self._keys.webhook_endpoints_version)
            await pipe.execute()

    # --- deliveries -----------------------------------------------------------------------

    async def emit(
        self,
        tenant: str,
        event_type: str,
        data: Mapping[str, Any],
        event_id: str,
        callback_url: str = "",
        endpoints: Sequence[Endpoint] | None = None,
        callback_payload: str = FULL,
    ) -> list[str]:
        """One delivery for each of the tenant's endpoints that takes ``event_type``, and one
        to ``callback_url`` if given (its body ``callback_payload``: FULL or THIN); the ids
        of those made now (an event emitted again makes none). ``endpoints``: the tenant's,
        where the caller holds them already (else they are read)."""
        if endpoints is None:
            endpoints = await self.endpoints(tenant)
        targets = [(e.endpoint_id, "", e.payload) for e in endpoints if event_type in e.events and not e.disabled]
        if callback_url:
            targets.append((CALLBACK, callback_url, callback_payload))
        if not targets:
            return []
        now_ms = int(time.time() * 1000)
        bodies = {
            kind: event_body(event_id, event_type, thin_data(event_type, data) if kind == THIN else data, now_ms)
            for kind in {kind for _, _, kind in targets}
        }
        made = []
        for endpoint_id, url, kind in targets:
            delivery = Delivery(
                delivery_id(event_id, endpoint_id),
                tenant,
                endpoint_id,
                event_type,
                bodies[kind],
                now_ms,
                next_at_ms=now_ms,
                url=url,
            )
            pairs = _pairs(_fields(delivery))
            keys = [
                self._keys.webhook_delivery(delivery.delivery_id),
                self._keys.webhook_due,
                self._keys.webhook_log(tenant),
            ]
            logged = await self._emit(keys=keys, args=[delivery.delivery_id, now_ms, *pairs])
            if logged:
                made.append(delivery.delivery_id)
            if logged > LOG_KEEP + TRIM_SLACK:
                await self._trim_log(tenant)
        return made

    async def _trim_log(self, tenant: str) -> None:
        """Keep the tenant's latest LOG_KEEP deliveries: the older ones leave its log, and
        their records go unless still pending (a pending one ends on its own, then expires)."""
        log_key = self._keys.webhook_log(tenant)
        old = [as_text(cast(bytes, i)) for i in await self._redis.zrange(log_key, 0, -LOG_KEEP - 1)]
        async with self._redis.pipeline(transaction=False) as pipe:
            for delivery_id in old:
                pipe.hget(self._keys.webhook_delivery(delivery_id), "state")
            states = await pipe.execute()
        async with self._redis.pipeline(transaction=False) as pipe:
            for delivery_id, state in zip(old, states):
                if state != b"pending" and state != "pending":
                    pipe.delete(self._keys.webhook_delivery(delivery_id))
            pipe.zrem(log_key, *old)
            await pipe.execute()

    async def delivery(self, delivery_id: str, tenant: str | None = None) -> Delivery | None:
        raw = await self._redis.hgetall(self._keys.webhook_delivery(delivery_id))
        if not raw or (b"payload" not in raw and "payload" not in raw):
            return None
        fields = {as_text(k): v for k, v in raw.items()}
        text = {name: as_text(value) for name, value in fields.items() if name != "payload"}
        payload = fields["payload"]
        found = Delivery(
            delivery_id,
            text["tenant"],
            text["endpoint_id"],
            text["event_type"],
            payload if isinstance(payload, bytes) else payload.encode(),
            int(text["created_at_ms"]),
            text["state"],
            int(text["attempts"]),
            int(text["last_status"]),
            text.get("last_error", ""),
            int(text["next_at_ms"]),
            text.get("url", ""),
        )
        return found if tenant is None or found.tenant == tenant else None

    async def claim_due(self, most: int, lease_ms: int) -> list[str]:
        """Up to ``most`` deliveries due now, each hidden for ``lease_ms`` while it is tried."""
        now_ms = int(time.time() * 1000)
        ids = await self._claim(keys=[self._keys.webhook_due], args=[now_ms, most, now_ms + lease_ms])
        return [as_text(i) for i in ids]

    async def record_attempt(self, delivery: Delivery) -> None:
        """Store an attempt's outcome: due again at ``next_at_ms`` while pending; off the
        due set once delivered or dead (dead ones listed apart)."""
        key = self._keys.webhook_delivery(delivery.delivery_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=_fields(delivery))
            if delivery.state == "pending":
                pipe.zadd(self._keys.webhook_due, {delivery.delivery_id: delivery.next_at_ms})
            else:
                pipe.zrem(self._keys.webhook_due, delivery.delivery_id)
                pipe.expire(key, FINAL_TTL_S)
            if delivery.state == "dead":
                dead = self._keys.webhook_dead(delivery.tenant)
                pipe.zadd(dead, {delivery.delivery_id: delivery.created_at_ms})
                pipe.zremrangebyrank(dead, 0, -LOG_KEEP - 1)
            await pipe.execute()

    async def defer(self, delivery_id: str, at_ms: int) -> None:
        """A delivery claimed but not tried (its endpoint or tenant had its share of
        attempts under way): due again at ``at_ms``, its attempts unchanged."""
        await self._redis.zadd(self._keys.webhook_due, {delivery_id: at_ms}, xx=True)

    async def replay(self, delivery: Delivery) -> None:
        """Try it again now, its attempts counted afresh (same id: a receiver that had it drops it)."""
        delivery.state, delivery.attempts, delivery.last_error = "pending", 0, ""
        delivery.created_at_ms = delivery.next_at_ms = int(time.time() * 1000)
        key = self._keys.webhook_delivery(delivery.delivery_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=_fields(delivery))
            pipe.persist(key)
            pipe.zrem(self._keys.webhook_dead(delivery.tenant), delivery.delivery_id)
            pipe.zadd(self._keys.webhook_due, {delivery.delivery_id: delivery.next_at_ms})
            await pipe.execute()

    async def listed(self, tenant: str, limit: int, dead: bool = False) -> list[Delivery]:
        """The tenant's latest deliveries (or dead ones), newest first."""
        index = self._keys.webhook_dead(tenant) if dead else self._keys.webhook_log(tenant)
        ids = [as_text(cast(bytes, i)) for i in await self._redis.zrevrange(index, 0, limit - 1)]
        found = [await self.delivery(i, tenant) for i in ids]
        return [d for d in found if d is not None]


def _pairs(fields: Mapping[str, Any]) -> list[Any]:
    return [part for name, value in fields.items() for part in (name, value)]


def _fields(delivery: Delivery) -> dict[Any, Any]:
    return {
        "tenant": delivery.tenant,
        "endpoint_id": delivery.endpoint_id,
        "event_type": delivery.event_type,
        "payload": delivery.payload,
        "created_at_ms": delivery.created_at_ms,
        "state": delivery.state,
        "attempts": delivery.attempts,
        "last_status": delivery.last_status,
        "last_error": delivery.last_error,
        "next_at_ms": delivery.next_at_ms,
        "url": delivery.url,
    }


EVENTS = {TaskStatus.DONE: "task.completed", TaskStatus.FAILED: "task.failed", TaskStatus.EXPIRED: "task.expired"}
TASK_EVENTS = frozenset(EVENTS.values())


class TaskEvents:
    """Announces a batch's finished tasks to their tenants' webhooks."""

    def __init__(
        self, webhooks: WebhookRecords, store: TaskStore, default_model: str, callback_payload: str = FULL
    ) -> None:
        """``callback_payload``: the body of deliveries to tasks' callback URLs, FULL or THIN."""
        self._webhooks = webhooks
        self._callback_payload = callback_payload
        self._store = store
        self._default_model = default_model
        self._endpoints: dict[str, list[Endpoint]] = {}  # tenant -> its endpoints, as last read
        self._version = -1  # of the endpoints read into _endpoints

    async def _endpoints_of(self, tenant: str) -> list[Endpoint]:
        endpoints = self._endpoints.get(tenant)
        if endpoints is None:
            endpoints = self._endpoints[tenant] = await self._webhooks.endpoints(tenant)
        return endpoints

    async def announce(self, requests: Sequence[TaskRequest]) -> int:
        """Emit the events of the requests' final tasks that their tenants want; how many."""
        version = await self._webhooks.endpoints_version()
        if version != self._version:  # an endpoint was added or removed: read them again
            self._endpoints.clear()
            self._version = version
        by_tenant: dict[str, list[TaskRequest]] = {}
        for request in requests:
            by_tenant.setdefault(request.tenant, []).append(request)
        emitted = 0
        for tenant, tenant_requests in by_tenant.items():
            endpoints = await self._endpoints_of(tenant)
            wanted = frozenset(event for endpoint in endpoints for event in endpoint.events)
            # Tasks with a callback are announced whatever the tenant's endpoints take.
            told = [request for request in tenant_requests if request.callback_url or wanted & TASK_EVENTS]
            if not told:
                continue
            records = await self._store.get_many([request.task_id for request in told])
            for request, record in zip(told, records):
                event = EVENTS.get(record.status) if record is not None else None
                if record is None or event is None:
                    continue
                callback = request.callback_url
                if event not in wanted and not callback:
                    continue
                answer = task_record_answer(request.task_id, record, self._default_model)
                made = await self._webhooks.emit(
                    tenant, event, answer, f"{request.task_id}:{event}", callback_url=callback, endpoints=endpoints,
                    callback_payload=self._callback_payload,
                )  # fmt: skip
                emitted += len(made)
        return emitted
