"""Task state and results in Redis: written by the API and the batchers, read by clients.

Every state change goes through one Lua script that moves a task only from the
states it may leave. That is what makes redelivery harmless: a batch replayed after
a crash cannot turn a ``done`` task back into ``running`` or overwrite its outputs
with a second result.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
from redis.crc import key_slot
from redis.exceptions import RedisError

from brimful.core.clock import now_ms
from brimful.core.redis_client import RedisClient, as_text, is_cluster
from brimful.core.redis_keys import RedisKeys
from brimful.core.task_status import TaskStatus

# KEYS: task hashes (on a Redis Cluster, all in one hash slot), then, when ARGV[8] is "1",
# the shared counters' hash. ARGV: ttl_s (kept from now on), now_ms, new status,
# allowed-from statuses (comma-separated; a missing hash never moves), field name, channel
# to publish the moved tasks on, all in one message ("" for none; see FinishedMessage), the
# prefix of the tenants' in-flight sets to remove a moved task from ("" to leave them: the
# new status is not final, or the sets live in other hash slots), "1" if the counters'
# hash is the last key, the counter that gains the number of tasks moved ("" for none),
# the number n of (counter, amount) pairs to add, those 2n values, then one field value
# per task ("" writes no field). Returns the 1-based position of each task that moved,
# followed by its tenant and the Redis key of its Idempotency-Key ("" for none). When the
# task becomes final and its in-flight set is left here (one Redis), that key is kept
# only ttl_s from now, as the task's result is (on a cluster the store does it after).
_TRANSITION_LUA = """
local ttl, now, new_status, allowed, field, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local in_flight_prefix = ARGV[7]
local counted = ARGV[8] == '1'
local moved_counter, pairs = ARGV[9], tonumber(ARGV[10])
local tasks = #KEYS
if counted then
  tasks = tasks - 1
end
local first_value = 10 + 2 * pairs
local moved = {}
local finished = {}
for i = 1, tasks do
  local key = KEYS[i]
  -- One read and one write a task: what it is now, and what it becomes.
  local kept = redis.call('HMGET', key, 'status', 'tenant', 'submitted_at_ms', 'model', 'idem')
  local current = kept[1]
  if current and string.find(',' .. allowed .. ',', ',' .. current .. ',', 1, true) then
    local value = ARGV[first_value + i]
    if field ~= '' and value ~= '' then
      redis.call('HSET', key, 'status', new_status, 'updated_at_ms', now, field, value)
    else
      redis.call('HSET', key, 'status', new_status, 'updated_at_ms', now)
    end
    redis.call('EXPIRE', key, ttl)
    local task_id = string.match(key, '[^:]+$')
    local tenant, submitted, model = kept[2] or '', kept[3] or '0', kept[4] or ''
    local idem = kept[5] or ''
    if in_flight_prefix ~= '' then
      redis.call('ZREM', in_flight_prefix .. tenant, task_id)
      if idem ~= '' then
        redis.call('EXPIRE', idem, ttl)
      end
    end
    if channel ~= '' then
      finished[#finished + 1] = table.concat({task_id, new_status, submitted, now, tenant, model, field, value}, '\\n')
    end
    moved[#moved + 1] = i
    moved[#moved + 1] = tenant
    moved[#moved + 1] = idem
  end
end
if #finished > 0 then
  redis.call('PUBLISH', channel, table.concat(finished, '\\030'))
end
if counted then
  for p = 0, pairs - 1 do
    redis.call('HINCRBY', KEYS[#KEYS], ARGV[11 + 2 * p], ARGV[12 + 2 * p])
  end
  if moved_counter ~= '' and #moved > 0 then
    redis.call('HINCRBY', KEYS[#KEYS], moved_counter, #moved / 3)
  end
end
return moved
"""

# KEYS[1]: a tenant's in-flight set. ARGV: submitted_at_ms, in-flight limit (0: none),
# stale_before_ms, task id. Counts the task in flight, or, when that would pass the limit,
# writes nothing and returns the tenant's count. Returns -1 when counted.
_ADMIT_LUA = """
local limit = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[3])
if limit > 0 then
  local count = redis.call('ZCARD', KEYS[1])
  if count >= limit then
    return count
  end
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4])
return -1
"""

# A whole group of new tasks in one call, on one Redis (a cluster spreads the keys over
# slots; it takes the pipeline of _ADMIT_LUA and HSETs instead). KEYS: per task, its record
# then its tenant's in-flight set. ARGV: the record's TTL, the queued status, then per task
# its submitted_at_ms, the tenant's limit (0: none), the oldest score still counted, its
# id, its tenant, its model and the Redis key of its Idempotency-Key ("": none). Each task is admitted as _ADMIT_LUA admits one, then recorded; a
# command that fails (a key of the wrong type) fails only its task, whose in-flight entry
# is taken back. Returns per task: -1 recorded, the tenant's count when refused (nothing
# written), or the error's text.
_CREATE_GROUP_LUA = """
local ttl, queued = ARGV[1], ARGV[2]
local outcomes = {}
local function failed(reply)
  return type(reply) == 'table' and reply.err
end
local trimmed = {}
for i = 1, #KEYS / 2 do
  local record, in_flight = KEYS[2 * i - 1], KEYS[2 * i]
  local at = 2 + 7 * (i - 1)
  local submitted, limit, oldest, task_id, tenant = ARGV[at + 1], tonumber(ARGV[at + 2]), ARGV[at + 3], ARGV[at + 4], ARGV[at + 5]
  local model, idem = ARGV[at + 6], ARGV[at + 7]
  local outcome = -1
  -- A tenant's stale entries are dropped once a group, not once a task, by the cutoff of
  -- its first task there: the others' differ by the few ms the group spans, against a
  -- window of the waiting TTL (days). A failure, once heard, answers each of the tenant's
  -- tasks in the group as it did the first.
  local reply = trimmed[in_flight]
  if reply == nil then
    reply = redis.pcall('ZREMRANGEBYSCORE', in_flight, '-inf', '(' .. oldest)
    trimmed[in_flight] = reply
  end
  if failed(reply) then
    outcome = reply.err
  elseif limit > 0 and redis.call('ZCARD', in_flight) >= limit then
    outcome = redis.call('ZCARD', in_flight)
  else
    redis.call('ZADD', in_flight, submitted, task_id)
    if idem ~= '' then
      reply = redis.pcall('HSET', record, 'status', queued, 'submitted_at_ms', submitted, 'updated_at_ms', submitted, 'tenant', tenant, 'model', model, 'idem', idem)
    else
      reply = redis.pcall('HSET', record, 'status', queued, 'submitted_at_ms', submitted, 'updated_at_ms', submitted, 'tenant', tenant, 'model', model)
    end
    if failed(reply) then
      redis.call('ZREM', in_flight, task_id)
      outcome = reply.err
    else
      redis.call('EXPIRE', record, ttl)
    end
  end
  outcomes[i] = outcome
end
return outcomes
"""

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

# KEYS[1]: a task's record. ARGV: ttl_s, now_ms, the running status, submitted_at_ms,
# tenant, model. Writes the record of a task read from Kafka whose record is gone, as
# running; nothing when a record exists (it says what the task is). Returns 1 if written.
_RECREATE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'status', ARGV[3], 'submitted_at_ms', ARGV[4], 'updated_at_ms', ARGV[2],
           'tenant', ARGV[5], 'model', ARGV[6], 'recreated', '1')
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
"""

# KEYS[1]: a task's record. ARGV: ttl_s, now_ms, the queued status, the failed status,
# submitted_at_ms, tenant, model. Puts a failed (or expired) task back to queued for a
# replay; any other task is left as it is. Returns "" when requeued, else the status kept.
_REQUEUE_LUA = """
local status = redis.call('HGET', KEYS[1], 'status')
if status and status ~= ARGV[4] then
  return status
end
redis.call('HDEL', KEYS[1], 'error', 'outputs', 'cached_outputs')
redis.call('HSET', KEYS[1], 'status', ARGV[3], 'submitted_at_ms', ARGV[5], 'updated_at_ms', ARGV[2],
           'tenant', ARGV[6], 'model', ARGV[7])
redis.call('EXPIRE', KEYS[1], ARGV[1])
return ''
"""

# Why a task whose Kafka record may still be read must never run (RedisKeys.tombstone).
TOMBSTONE_CANCELLED = "cancelled"
TOMBSTONE_WITHDRAWN = "withdrawn"

# What an Idempotency-Key holds while its first submission is under way.
_PENDING = "pending:"

# The state machine never moves a task whose record is gone; ``recreate_missing`` brings
# such a task back from its Kafka record, unless its tombstone says it must not run.
_NOT_FINAL = f"{TaskStatus.QUEUED},{TaskStatus.RUNNING}"
_QUEUED = f"{TaskStatus.QUEUED}"
# The field a done task's outputs are stored in when they came from an identical task's
# call (the result cache) rather than its own: the same JSON, and the answer says cached.
CACHED_OUTPUTS = "cached_outputs"


class KnownTask(NamedTuple):
    """What a task's Kafka record says of it: enough to write its record again."""

    task_id: str
    submitted_at_ms: int
    tenant: str
    model: str


class NewTask(NamedTuple):
    """A task to record as queued: its id, when it was submitted, its tenant, the
    tenant's limit of tasks in flight (0: none), the model it is for, and the
    Idempotency-Key it was submitted with ("": none; its lifetime then follows the task's)."""

    task_id: str
    submitted_at_ms: int
    tenant: str = ""
    max_in_flight: int = 0
    model: str = ""
    idempotency_key: str = ""


@dataclass(frozen=True)
class IdempotencyHold:
    """What an Idempotency-Key is bound to: the task it was first used for, whether that
    first submission is still under way (its task may never be accepted), and, while it
    is, since when (ms; 0 for a claim of an older release). ``raw``: the value held."""

    task_id: str
    pending: bool
    claimed_at_ms: int = 0
    raw: str = ""


@dataclass(frozen=True)
class TaskRecord:
    """A task as stored: what ``GET /v1/tasks/{id}`` shows."""

    task_id: str
    status: TaskStatus
    submitted_at_ms: int
    updated_at_ms: int
    outputs: dict[str, Any] | None
    error: dict[str, Any] | None
    tenant: str = ""
    model: str = ""  # empty for a task recorded before tasks named their model
    cached: bool = False  # done with a result computed for an identical task, not its own call


class FinishedMessage:
    """What the store publishes on ``RedisKeys.finished_channel`` when tasks reach a final
    state: one message for all the tasks one step moved (a batch's, say), each entry the
    whole final record, so a waiting request can answer without reading the task back.
    Entries are separated by the ASCII record separator (0x1E); each has eight
    newline-separated fields: task id, status, submitted_at_ms, updated_at_ms, tenant,
    model, then the name of the stored field ("outputs", "cached_outputs", "error" or
    empty) and its JSON value. Task ids, model names and tenants hold neither character, and JSON text holds
    no raw control character. A message from a batcher of the release before tasks named
    their model has no model field."""

    SEPARATOR = b"\x1e"

    @staticmethod
    def entries(payload: bytes) -> list[bytes]:
        """One entry per task (a message from before batching is one entry)."""
        return payload.split(FinishedMessage.SEPARATOR)

    @staticmethod
    def task_id(entry: bytes) -> str:
        """Just the id: cheap, for the many entries nobody waits on."""
        return entry.split(b"\n", 1)[0].decode()

    @staticmethod
    def record(entry: bytes) -> TaskRecord:
        parts = entry.decode().split("\n", 7)
        if len(parts) == 7:  # no model field: its JSON value holds no newline, so 7 is unambiguous
            parts.insert(5, "")
        task_id, status, submitted, updated, tenant, model, field, value = parts
        decoded = orjson.loads(value) if field and value else None
        return TaskRecord(
            task_id=task_id,
            status=TaskStatus(status),
            submitted_at_ms=int(submitted),
            updated_at_ms=int(updated),
            outputs=decoded if field in ("outputs", CACHED_OUTPUTS) else None,
            error=decoded if field == "error" else None,
            tenant=tenant,
            model=model,
            cached=field == CACHED_OUTPUTS,
        )


class TaskStore:
    """Reads and writes task state; one instance per process, sharing one Redis pool."""

    def __init__(
        self,
        redis: RedisClient,
        keys: RedisKeys,
        ttl_s: int,
        waiting_ttl_s: int = 7 * 24 * 3600,
        stats_model: str | None = None,
    ) -> None:
        """``stats_model``: whose counters ``mark_done`` adds to (None: the default model's)."""
        self._redis = redis
        self._keys = keys
        self._stats_key = keys.model_stats(stats_model)
        self._ttl_s = ttl_s  # a final task's record
        # An unfinished task's record: far longer, so it never expires while it waits.
        self._waiting_ttl_s = max(ttl_s, waiting_ttl_s)
        # On a cluster every task hash has a hash slot of its own, apart from its tenant's
        # in-flight set: no script may touch both, and a batch's tasks take a script call
        # per slot (in one pipeline).
        self._cluster = is_cluster(redis)
        self._transition = redis.register_script(_TRANSITION_LUA)
        self._swap_if = redis.register_script(_SWAP_IF_LUA)
        self._create_group = redis.register_script(_CREATE_GROUP_LUA)
        self._recreate = redis.register_script(_RECREATE_LUA)
        self._requeue = redis.register_script(_REQUEUE_LUA)

    @property
    def keys(self) -> RedisKeys:
        """The key layout this store writes under."""
        return self._keys

    async def create_queued(
        self, task_id: str, submitted_at_ms: int, tenant: str = "", max_in_flight: int = 0, model: str = ""
    ) -> int | None:
        """Record a newly accepted task as queued and count it in its tenant's tasks in
        flight (one round trip). Written before the request reaches Kafka, so a fast
        batcher can never find the task missing or have its result overwritten. When the
        tenant already has ``max_in_flight`` unfinished tasks (0: no limit), the record is
        taken back and that count is returned; None when recorded. The count and the check
        are one atomic step, so concurrent submissions are never over-admitted."""
        (outcome,) = await self.create_queued_many([NewTask(task_id, submitted_at_ms, tenant, max_in_flight, model)])
        if isinstance(outcome, RedisError):
            raise outcome
        return outcome

    async def create_queued_many(self, tasks: Sequence[NewTask]) -> list[int | RedisError | None]:
        """``create_queued`` for a group of tasks in one round trip. Each is answered on its
        own, in order: None when recorded, its tenant's count when refused, or the
        RedisError of a command of its own that failed (say a key of its tenant's holding
        the wrong type); nothing of a refused or failed task stays. When the round trip
        itself fails (connection, timeout), nothing of the group is left behind (as far as
        Redis lets it be removed) and the error is raised."""
        if not tasks:
            return []
        try:
            if self._cluster:
                return await self._create_queued_in_slots(tasks)
            keys: list[str] = []
            args: list[str | int] = [self._waiting_ttl_s, TaskStatus.QUEUED.value]
            for task in tasks:
                keys += [self._keys.task(task.task_id), self._keys.in_flight(task.tenant)]
                args += [
                    task.submitted_at_ms,
                    task.max_in_flight,
                    task.submitted_at_ms - self._waiting_ttl_s * 1000,
                    task.task_id,
                    task.tenant,
                    task.model,
                    self._keys.idempotency(task.idempotency_key) if task.idempotency_key else "",
                ]
            replies = await self._create_group(keys=keys, args=args)
        except RedisError:
            await self._forget_quietly([(task.task_id, task.tenant) for task in tasks])
            raise
        return [
            RedisError(reply.decode(errors="replace"))
            if isinstance(reply, bytes)
            else None
            if int(reply) < 0
            else int(reply)
            for reply in replies
        ]

    async def _create_queued_in_slots(self, tasks: Sequence[NewTask]) -> list[int | RedisError | None]:
        # On a cluster a task's record and its tenant's set live in different slots: one
        # pipeline writes the records and admits each task, and the refused and failed
        # ones are taken back in a second round trip, only when there are any.
        async with self._redis.pipeline(transaction=False) as pipe:
            for task in tasks:
                key = self._keys.task(task.task_id)
                pipe.hset(
                    key,
                    mapping={
                        "status": TaskStatus.QUEUED.value,
                        "submitted_at_ms": task.submitted_at_ms,
                        "updated_at_ms": task.submitted_at_ms,
                        "tenant": task.tenant,
                        "model": task.model,
                        **({"idem": self._keys.idempotency(task.idempotency_key)} if task.idempotency_key else {}),
                    },
                )
                pipe.expire(key, self._waiting_ttl_s)
                # As text: a registered script in a pipeline costs a round trip more (redis-py
                # checks that it is loaded first), and Redis caches the text by its hash.
                pipe.eval(
                    _ADMIT_LUA,
                    1,
                    self._keys.in_flight(task.tenant),
                    task.submitted_at_ms,
                    task.max_in_flight,
                    task.submitted_at_ms - self._waiting_ttl_s * 1000,
                    task.task_id,
                )
            replies = await pipe.execute(raise_on_error=False)
        outcomes: list[int | RedisError | None] = []
        for index in range(len(tasks)):
            own = replies[3 * index : 3 * index + 3]
            failed = next((reply for reply in own if isinstance(reply, Exception)), None)
            if failed is not None:
                outcomes.append(failed if isinstance(failed, RedisError) else RedisError(str(failed)))
            else:
                count = int(own[2])
                outcomes.append(None if count < 0 else count)
        # Nobody was given the ids of refused or failed tasks: taking their records back
        # leaves no trace. Should that fail too, they expire unseen with the waiting TTL.
        taken_back = [(t.task_id, t.tenant) for t, outcome in zip(tasks, outcomes) if outcome is not None]
        if taken_back:
            await self._forget_quietly(taken_back)
        return outcomes

    async def requeue(self, task_id: str, submitted_at_ms: int, tenant: str = "", model: str = "") -> str | None:
        """Put a failed task back to ``queued`` for a replay (recreating it if it expired),
        in one atomic step that touches nothing else: a task done, cancelled, or already
        queued or running again (a second dead letter of it replayed) keeps its state and
        its result. Returns None when requeued, else the status it keeps. Written before the
        request is sent again, as for a new task; it counts as in flight for its tenant
        again (an operator's replay is never refused for it)."""
        kept = await self._requeue(
            keys=[self._keys.task(task_id)],
            args=[
                self._waiting_ttl_s,
                now_ms(),
                TaskStatus.QUEUED.value,
                TaskStatus.FAILED.value,
                submitted_at_ms,
                tenant,
                model,
            ],
        )
        if kept:
            return str(kept.decode() if isinstance(kept, bytes) else kept)
        await self._redis.zadd(self._keys.in_flight(tenant), {task_id: now_ms()})
        return None

    async def claim_idempotency_key(self, key: str, task_id: str) -> IdempotencyHold | None:
        """Claim an Idempotency-Key for ``task_id`` while its submission is under way; None
        when claimed. Otherwise what the key holds: the task it was first used for, and
        whether that submission is still under way. A claim lives as long as a task may
        wait (an API killed between the broker's acknowledgement and the commit leaves
        it: a later claimant may take it over, ``take_over_idempotency_key``)."""
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

    async def take_over_idempotency_key(self, key: str, held: IdempotencyHold, task_id: str) -> bool:
        """Make a pending claim whose submission stopped without a word (its API killed or
        stopped past its grace) this submission's, for ``task_id`` (the stopped one's, or
        a new one when that was never recorded); False if the key changed meanwhile
        (another claimant took it, or its submission ended)."""
        value = f"{_PENDING}{task_id}:{now_ms()}"
        return bool(
            await self._swap_if(keys=[self._keys.idempotency(key)], args=[held.raw, value, self._waiting_ttl_s])
        )

    async def commit_idempotency_key(self, key: str, task_id: str) -> bool:
        """Bind the key to ``task_id`` now that the task is accepted, for as long as the
        task may wait (its final move shortens that to the retention time of its result);
        False if the claim is no longer this submission's."""
        redis_key = self._keys.idempotency(key)
        held = await self._redis.get(redis_key)
        if held is None or not as_text(held).startswith(f"{_PENDING}{task_id}"):
            return False
        return bool(await self._swap_if(keys=[redis_key], args=[as_text(held), task_id, self._waiting_ttl_s]))

    async def release_idempotency_key(self, key: str, task_id: str) -> None:
        """Free a key whose task was never accepted, so the client's retry can use it
        (only if it still holds this submission's claim). Raises on a Redis error: the
        claim then stays until a retry takes it over."""
        redis_key = self._keys.idempotency(key)
        held = await self._redis.get(redis_key)
        if held is not None and as_text(held).startswith(f"{_PENDING}{task_id}"):
            await self._swap_if(keys=[redis_key], args=[as_text(held), "", 0])

    async def forget(self, task_id: str, tenant: str = "") -> None:
        """Remove a task that was never accepted (its enqueue failed), and its slot in flight."""
        await self.forget_many([(task_id, tenant)])

    async def withdraw_many(self, tasks: Sequence[tuple[str, str]]) -> None:
        """``forget`` (task id, tenant) pairs whose Kafka record may exist all the same (a
        send the broker answered with an error may have landed): each gets its tombstone
        first, so a batcher that reads the record never brings the task back."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for task_id, _ in tasks:
                pipe.set(self._keys.tombstone(task_id), TOMBSTONE_WITHDRAWN, ex=self._waiting_ttl_s)
            await pipe.execute()
        await self.forget_many(tasks)

    async def forget_many(self, tasks: Sequence[tuple[str, str]]) -> None:
        """``forget`` for (task id, tenant) pairs, in one round trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for task_id, tenant in tasks:
                pipe.delete(self._keys.task(task_id))
                pipe.zrem(self._keys.in_flight(tenant), task_id)
            await pipe.execute()

    async def _forget_quietly(self, tasks: Sequence[tuple[str, str]]) -> None:
        # After a failed create: whatever half of it landed goes; if Redis is down, the
        # records expire and the in-flight entries age out with the waiting TTL.
        try:
            await self.forget_many(tasks)
        except RedisError:
            pass

    async def get(self, task_id: str) -> TaskRecord | None:
        """The stored task, or None when unknown or expired."""
        raw = await self._redis.hgetall(self._keys.task(task_id))
        if not raw:
            return None
        fields = {as_text(k): as_text(v) for k, v in raw.items()}
        return TaskRecord(
            task_id=task_id,
            status=TaskStatus(fields["status"]),
            submitted_at_ms=int(fields.get("submitted_at_ms", 0)),
            updated_at_ms=int(fields.get("updated_at_ms", 0)),
            outputs=orjson.loads(outputs) if (outputs := fields.get("outputs", fields.get(CACHED_OUTPUTS))) else None,
            error=orjson.loads(fields["error"]) if "error" in fields else None,
            tenant=fields.get("tenant", ""),
            model=fields.get("model", ""),
            cached=CACHED_OUTPUTS in fields,
        )

    async def unfinished(self, task_ids: Iterable[str]) -> list[str]:
        """Those of these tasks that have not reached a final state (in one round trip)."""
        ids = list(task_ids)
        if not ids:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for task_id in ids:
                pipe.hget(self._keys.task(task_id), "status")
            statuses = await pipe.execute()
        return [
            task_id
            for task_id, status in zip(ids, statuses)
            if status is None or not TaskStatus(status.decode()).is_final
        ]

    async def mark_running(self, task_ids: Iterable[str]) -> list[str]:
        """Move tasks to running; returns those that moved. Final ones (a task cancelled a
        moment ago among them) stay as they are and must not be sent to the model: this
        atomic move is what decides between a cancel and a dispatch."""
        ids = list(task_ids)
        return await self._move(ids, TaskStatus.RUNNING, _NOT_FINAL, "", ["" for _ in ids])

    async def recreate_missing(self, tasks: Sequence[KnownTask]) -> list[str]:
        """Write the record of each task whose record is gone (Redis lost it: a restart, a
        failover, a lost second of AOF), as running, from what its Kafka record says;
        returns the ids written. The Kafka record is the source of truth: a task without a
        record is computed, unless its tombstone says it was cancelled or withdrawn. A task
        whose record exists is left as it is. Two round trips, only on this rare path."""
        if not tasks:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for task in tasks:
                pipe.exists(self._keys.task(task.task_id))
                pipe.exists(self._keys.tombstone(task.task_id))
            found = await pipe.execute()
        missing = [task for index, task in enumerate(tasks) if not found[2 * index] and not found[2 * index + 1]]
        if not missing:
            return []
        now = now_ms()
        async with self._redis.pipeline(transaction=False) as pipe:
            for task in missing:
                # As text: a registered script in a pipeline costs a round trip more.
                pipe.eval(
                    _RECREATE_LUA,
                    1,
                    self._keys.task(task.task_id),
                    self._waiting_ttl_s,
                    now,
                    TaskStatus.RUNNING.value,
                    task.submitted_at_ms,
                    task.tenant,
                    task.model,
                )
            written = await pipe.execute()
        return [task.task_id for task, wrote in zip(missing, written) if int(wrote)]

    async def mark_done(
        self,
        outputs_by_task: Mapping[str, Mapping[str, Any]],
        counters: Mapping[str, int] | None = None,
        done_counter: str = "",
        cached: bool = False,
    ) -> int:
        """Store outputs and move tasks to done, unless they already reached a final state.
        ``counters`` are added to the shared counters (``RedisKeys.model_stats``) and
        ``done_counter`` gains the number of tasks moved, in the same round trip on one
        Redis (in the move itself), so a batch's result costs one. ``cached``: the outputs
        were computed for an identical task (stored as ``cached_outputs``, so every answer
        can say so)."""
        ids = list(outputs_by_task)
        # orjson: a twenty-fifth of json.dumps's cost for a row's outputs (0.3 against 7.5 us).
        values = [orjson.dumps(outputs_by_task[t]) for t in ids]
        moved = await self._move(
            ids,
            TaskStatus.DONE,
            _NOT_FINAL,
            CACHED_OUTPUTS if cached else "outputs",
            values,
            publish=True,
            counters=counters or {},
            moved_counter=done_counter,
        )
        return len(moved)

    async def mark_failed(self, task_ids: Iterable[str], error: Mapping[str, Any]) -> int:
        """Record the error and move tasks to failed, unless they already reached a final state."""
        ids = list(task_ids)
        value = orjson.dumps(error)
        return len(await self._move(ids, TaskStatus.FAILED, _NOT_FINAL, "error", [value for _ in ids], publish=True))

    async def cancel(self, task_id: str, model: str | None = None) -> bool:
        """Cancel a task that is still queued; False if it already left the queue. Its
        model's batchers (``model``: its scope, None for the default model) hear of it."""
        moved = await self._move([task_id], TaskStatus.CANCELLED, _QUEUED, "", [""], publish=True)
        if moved:
            # The tombstone outlives the record, so a redelivered record never runs it.
            await self._redis.set(self._keys.tombstone(task_id), TOMBSTONE_CANCELLED, ex=self._waiting_ttl_s)
            await self._redis.publish(self._keys.model_cancelled_channel(model), task_id)
        return bool(moved)

    async def _move(
        self,
        task_ids: list[str],
        status: TaskStatus,
        allowed_from: str,
        field: str,
        values: Sequence[str | bytes],
        publish: bool = False,
        counters: Mapping[str, int] | None = None,
        moved_counter: str = "",
    ) -> list[str]:
        counters = {name: amount for name, amount in (counters or {}).items() if amount}
        if not task_ids:
            return []
        keys = [self._keys.task(t) for t in task_ids]
        channel = self._keys.finished_channel if publish else ""
        # On one Redis the script leaves the tenants' in-flight sets in the same step; on a
        # cluster they live in other slots, and are left right after (see below).
        in_flight_prefix = self._keys.in_flight_prefix if status.is_final and not self._cluster else ""
        ttl = self._ttl_s if status.is_final else self._waiting_ttl_s
        args = [ttl, now_ms(), status.value, allowed_from, field, channel, in_flight_prefix]
        # On one Redis the counters are added by the move itself; on a cluster their hash
        # lives in another slot, and they are added right after (see below).
        counted = bool(counters or moved_counter) and not self._cluster
        if counted:
            pairs = [part for name, amount in counters.items() for part in (name, amount)]
            args += ["1", moved_counter, len(counters), *pairs]
            keys_with_stats = [*keys, self._stats_key]
        else:
            args += ["0", "", 0]
            keys_with_stats = keys
        groups = _by_slot(keys) if self._cluster else [list(range(len(keys)))]
        if len(groups) == 1:
            replies = [await self._transition(keys=keys_with_stats, args=[*args, *values])]
        else:
            async with self._redis.pipeline(transaction=False) as pipe:
                for group in groups:
                    pipe.eval(
                        _TRANSITION_LUA, len(group), *(keys[i] for i in group), *args, *(values[i] for i in group)
                    )
                replies = await pipe.execute()
        moved: list[tuple[str, str, bytes]] = []  # (task id, tenant, its Idempotency-Key's Redis key)
        for group, reply in zip(groups, replies):
            for position, tenant, idem in zip(reply[::3], reply[1::3], reply[2::3]):
                moved.append((task_ids[group[int(position) - 1]], tenant.decode(), idem))
        if self._cluster and ((status.is_final and moved) or counters or (moved_counter and moved)):
            # A crash before this leaves an in-flight entry that ages out with the waiting
            # TTL (the task itself is final either way), and the counters short.
            async with self._redis.pipeline(transaction=False) as pipe:
                if status.is_final:
                    for task_id, tenant, idem in moved:
                        pipe.zrem(self._keys.in_flight(tenant), task_id)
                        if idem:
                            pipe.expire(idem, ttl)
                for name, amount in counters.items():
                    pipe.hincrby(self._stats_key, name, amount)
                if moved_counter and moved:
                    pipe.hincrby(self._stats_key, moved_counter, len(moved))
                await pipe.execute()
        return [task_id for task_id, _, _ in moved]


def _by_slot(keys: list[str]) -> list[list[int]]:
    """The positions of ``keys`` grouped by hash slot, in first-seen order."""
    groups: dict[int, list[int]] = {}
    for position, key in enumerate(keys):
        groups.setdefault(key_slot(key.encode()), []).append(position)
    return list(groups.values())
