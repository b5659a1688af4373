"""Admission: a new task is recorded as queued and counted in its tenant's tasks in flight,
unless that would pass the tenant's limit; then nothing is written.

The rule is one Lua function (``_ADMIT_RULE_LUA``). On one Redis a whole group of new
tasks is admitted and recorded in one script call; on a Redis Cluster a task's record and
its tenant's set live in different hash slots, so each task's admission is a script call
of its own beside its record's write, in one pipeline.

Either way each task recorded also joins the set of unconfirmed tasks
(``RedisKeys.unconfirmed``, ``UnconfirmedTasks``), scored by when it was recorded. An API
records a task before it sends the task's record to the broker, and answers 202 only once
the broker acknowledges it; between the two the task already counts in its tenant's tasks
in flight. An API killed in between (SIGKILL, its node lost) can neither take the task
back nor send it: without this set the task would hold its tenant's quota until the
waiting TTL trims it (days). The API takes the entry out once the broker has answered (in
bulk, about a second later: ``api/tasks/group_commit.py``). An entry older than the
longest a submission can take belongs to a submission that stopped without a word.
Whether its record reached the broker cannot be told from here, so the sweep does the one
thing that is right either way: it takes the task out of its tenant's in-flight set. A
task that did reach the broker still runs (its final move would have taken it out
anyway); one that did not stays ``queued``, unknown to anyone (its client had no answer),
until its record expires. A retry with its Idempotency-Key sends it again
(``api/tasks/idempotency.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from brimful.core.redis_client import RedisClient, as_text
from brimful.core.redis_keys import RedisKeys
from brimful.core.task_record import WRITE_RECORD_LUA, Field, NewTask, TaskStatus, record_fields

# trim(in_flight, oldest): drop entries older than any task may wait (a task that somehow
# ended unseen must not hold its tenant's quota for ever); returns the reply (pcall).
# admit(in_flight, submitted_at_ms, limit, task_id): count the task in flight unless the
# tenant already has ``limit`` (0: no limit); -1 when counted, else the tenant's count.
_ADMIT_RULE_LUA = """
local function trim(in_flight, oldest)
  return redis.pcall('ZREMRANGEBYSCORE', in_flight, '-inf', '(' .. oldest)
end
local function admit(in_flight, submitted, limit, task_id)
  if limit > 0 then
    local count = redis.call('ZCARD', in_flight)
    if count >= limit then
      return count
    end
  end
  redis.call('ZADD', in_flight, submitted, task_id)
  return -1
end
"""

# One task, on a cluster. KEYS[1]: the tenant's in-flight set. ARGV: submitted_at_ms, the
# limit (0: none), the oldest score still counted, the task id. Returns as ``admit`` does.
_ADMIT_ONE_LUA = (
    _ADMIT_RULE_LUA
    + """
local reply = trim(KEYS[1], ARGV[3])
if type(reply) == 'table' and reply.err then
  return reply
end
return admit(KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[4])
"""
)

# A group, on one Redis. KEYS: per task, its record then its tenant's in-flight set; last,
# the set of unconfirmed tasks. ARGV: the record's TTL, the queued status, then per task
# its submitted_at_ms, the tenant's limit, the oldest score still counted, its id, its
# tenant, its model and the Redis key of its Idempotency-Key ("": none). A command that
# fails (a key of the wrong type) fails only its task, whose in-flight entry is taken
# back. Each task recorded joins the unconfirmed set.
# Returns per task: -1 recorded, the tenant's count when refused (nothing written), or the
# error's text.
_ADMIT_GROUP_LUA = (
    _ADMIT_RULE_LUA
    + WRITE_RECORD_LUA
    + """
local ttl, queued = ARGV[1], ARGV[2]
local outcomes = {}
local function failed(reply)
  return type(reply) == 'table' and reply.err
end
local trimmed = {}
local unconfirmed, recorded = KEYS[#KEYS], {}  -- recorded: score, member, ... for one ZADD
for i = 1, (#KEYS - 1) / 2 do
  local record, in_flight = KEYS[2 * i - 1], KEYS[2 * i]
  local at = 2 + 7 * (i - 1)
  local submitted, limit, oldest, task_id = ARGV[at + 1], tonumber(ARGV[at + 2]), ARGV[at + 3], ARGV[at + 4]
  local tenant, model, idem = ARGV[at + 5], ARGV[at + 6], ARGV[at + 7]
  local outcome = -1
  -- A tenant's stale entries are dropped once a group, not once a task, by the cutoff of
  -- its first task there: the others' differ by the few ms the group spans, against a
  -- window of the waiting TTL (days). A failure, once heard, answers each of the tenant's
  -- tasks in the group as it did the first.
  local reply = trimmed[in_flight]
  if reply == nil then
    reply = trim(in_flight, oldest)
    trimmed[in_flight] = reply
  end
  if failed(reply) then
    outcome = reply.err
  else
    outcome = admit(in_flight, submitted, limit, task_id)
    if outcome == -1 then
      if idem ~= '' then
        reply = write_record(redis.pcall, record, ttl, queued, submitted, submitted, tenant, model, F.IDEMPOTENCY_KEY, idem)
      else
        reply = write_record(redis.pcall, record, ttl, queued, submitted, submitted, tenant, model)
      end
      if failed(reply) then
        redis.call('ZREM', in_flight, task_id)
        outcome = reply.err
      else
        recorded[#recorded + 1] = submitted
        recorded[#recorded + 1] = task_id .. ' ' .. tenant
      end
    end
  end
  outcomes[i] = outcome
end
-- One ZADD for the group, not one a task: 11.9 against 12.4 us of Redis's CPU a task for
-- the whole script, groups of 64 (unpack's stack is bounded: a larger group takes more).
for first = 1, #recorded, 1000 do
  redis.call('ZADD', unconfirmed, unpack(recorded, first, math.min(first + 999, #recorded)))
end
return outcomes
"""
)

# What admission answers for a task: None recorded, the tenant's count when refused, or
# the error of a command of its own that failed.
Outcome = int | RedisError | None


class Admission:
    """Records new tasks as queued, counted in their tenants' tasks in flight."""

    def __init__(self, redis: RedisClient, keys: RedisKeys, waiting_ttl_s: int, cluster: bool) -> None:
        self._redis = redis
        self._keys = keys
        self._waiting_ttl_s = waiting_ttl_s
        self._cluster = cluster
        self._admit_group = redis.register_script(_ADMIT_GROUP_LUA)

    async def admit(self, tasks: Sequence[NewTask]) -> list[Outcome]:
        """Each task answered on its own, in order. Raises when the round trip itself
        fails (connection, timeout); then part of the group may have been written."""
        if self._cluster:
            return await self._admit_in_slots(tasks)
        keys: list[str] = []
        args: list[str | int] = [self._waiting_ttl_s, TaskStatus.QUEUED.value]
        for task in tasks:
            keys += [self._keys.task(task.task_id), self._keys.in_flight(task.tenant)]
            args += [
                task.submitted_at_ms,
                task.max_in_flight,
                self._oldest_counted(task),
                task.task_id,
                task.tenant,
                task.model,
                self._keys.idempotency(task.idempotency_key) if task.idempotency_key else "",
            ]
        keys.append(self._keys.unconfirmed)
        replies = await self._admit_group(keys=keys, args=args)
        return [
            RedisError(reply.decode(errors="replace"))
            if isinstance(reply, bytes)
            else None
            if int(reply) < 0
            else int(reply)
            for reply in replies
        ]

    async def take_back(self, tasks: Sequence[tuple[str, str]]) -> None:
        """Remove (task id, tenant) pairs' records, in-flight and unconfirmed entries, in one
        round trip."""
        if not tasks:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for task_id, tenant in tasks:
                pipe.delete(self._keys.task(task_id))
                pipe.zrem(self._keys.in_flight(tenant), task_id)
            pipe.zrem(self._keys.unconfirmed, *(unconfirmed_member(task_id, tenant) for task_id, tenant in tasks))
            await pipe.execute()

    def _oldest_counted(self, task: NewTask) -> int:
        return task.submitted_at_ms - self._waiting_ttl_s * 1000

    async def _admit_in_slots(self, tasks: Sequence[NewTask]) -> list[Outcome]:
        # One pipeline writes the records and admits each task; the refused and failed ones
        # are taken back in a second round trip, only when there are any.
        async with self._redis.pipeline(transaction=False) as pipe:
            for task in tasks:
                key = self._keys.task(task.task_id)
                fields: dict[Any, Any] = record_fields(TaskStatus.QUEUED, task.submitted_at_ms, task.tenant, task.model)
                if task.idempotency_key:
                    fields[Field.IDEMPOTENCY_KEY] = self._keys.idempotency(task.idempotency_key)
                pipe.hset(key, mapping=fields)
                pipe.expire(key, self._waiting_ttl_s)
                # As text: a registered script in a pipeline costs a round trip more (redis-py
                # checks that it is loaded first), and Redis caches the text by its hash.
                pipe.eval(
                    _ADMIT_ONE_LUA,
                    1,
                    self._keys.in_flight(task.tenant),
                    task.submitted_at_ms,
                    task.max_in_flight,
                    self._oldest_counted(task),
                    task.task_id,
                )
            # Every task of the group, refused ones too (taken back below with the rest of them).
            pipe.zadd(
                self._keys.unconfirmed,
                {unconfirmed_member(task.task_id, task.tenant): task.submitted_at_ms for task in tasks},
            )
            replies = await pipe.execute(raise_on_error=False)
        # A task not in the unconfirmed set is not recorded: should that one command fail,
        # the whole group is answered with its error.
        tracked = replies[-1]
        outcomes: list[Outcome] = []
        for index in range(len(tasks)):
            own = [*replies[3 * index : 3 * index + 3], tracked]
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
            try:
                await self.take_back(taken_back)
            except RedisError:
                pass
        return outcomes


# Members a command names at most: one ZREM of a busy second's confirmations stays small.
COMMAND_MEMBERS = 1000


def unconfirmed_member(task_id: str, tenant: str) -> str:
    """The set's member for a task: its id, a space, its tenant (ids never hold a space).
    The admission script above builds the same string."""
    return f"{task_id} {tenant}"


def task_of(member: str) -> tuple[str, str]:
    """(task id, tenant) of a member."""
    task_id, _, tenant = member.partition(" ")
    return task_id, tenant


class UnconfirmedTasks:
    """The set of recorded, unconfirmed tasks: confirming entries, sweeping stale ones."""

    def __init__(self, redis: RedisClient, keys: RedisKeys) -> None:
        self._redis = redis
        self._keys = keys

    async def confirm(self, members: Sequence[str]) -> None:
        """Take ``members`` out: the broker answered for their tasks (or they were taken back)."""
        key = self._keys.unconfirmed
        for start in range(0, len(members), COMMAND_MEMBERS):
            await self._redis.zrem(key, *members[start : start + COMMAND_MEMBERS])

    async def release_stale(self, recorded_before_ms: int) -> list[tuple[str, str]]:
        """Take the tasks recorded before ``recorded_before_ms`` and never confirmed out of
        their tenants' in-flight sets and out of this one, at most COMMAND_MEMBERS a call;
        returns their (task id, tenant). Safe beside another API doing the same."""
        key = self._keys.unconfirmed
        raw = await self._redis.zrangebyscore(key, "-inf", f"({recorded_before_ms}", start=0, num=COMMAND_MEMBERS)
        members = [as_text(member) for member in raw if isinstance(member, bytes | str)]  # no scores asked
        if not members:
            return []
        tasks = [task_of(member) for member in members]
        # In-flight entries first: a failure between the two leaves the member to sweep again.
        async with self._redis.pipeline(transaction=False) as pipe:
            for task_id, tenant in tasks:
                pipe.zrem(self._keys.in_flight(tenant), task_id)
            await pipe.execute()
        await self._redis.zrem(key, *members)
        return tasks
