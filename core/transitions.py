"""The one way a task changes state: a Lua script that moves tasks only from the states
they may leave, in one step with what goes with the move (the stored field, the tenant's
in-flight entry, the Idempotency-Key's lifetime, the shared counters, the finished-tasks
message). On a Redis Cluster a batch's tasks take a script call per hash slot (in one
pipeline), and what lives in other slots follows right after."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from redis.crc import key_slot

from brimful.core.clock import now_ms
from brimful.core.redis_client import RedisClient
from brimful.core.redis_keys import RedisKeys
from brimful.core.task_record import FIELDS_LUA, FINISHED_MESSAGE_LUA, TaskStatus

# KEYS: task hashes (on a Redis Cluster, all in one hash slot), then, when ARGV[8] is "1",
# the shared counters' hash. ARGV: ttl_s (kept from now on), now_ms, new status,
# allowed-from statuses (comma-separated; a missing hash never moves), field name, channel
# to publish the moved tasks on, all in one message ("" for none), the prefix of the
# tenants' in-flight sets to remove a moved task from ("" to leave them: the new status is
# not final, or the sets live in other hash slots), "1" if the counters' hash is the last
# key, the counter that gains the number of tasks moved ("" for none), the number n of
# (counter, amount) pairs to add, those 2n values, then one field value per task (""
# writes no field). Returns the 1-based position of each task that moved, followed by its
# tenant and the Redis key of its Idempotency-Key ("" for none). When the task becomes
# final and its in-flight set is left here (one Redis), that key is kept only ttl_s from
# now, as the task's result is (on a cluster the store does it after).
_TRANSITION_LUA = (
    FIELDS_LUA
    + FINISHED_MESSAGE_LUA
    + """
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
  local kept = redis.call('HMGET', key, F.STATUS, F.TENANT, F.SUBMITTED_AT_MS, F.MODEL, F.IDEMPOTENCY_KEY)
  local current = kept[1]
  if current and string.find(',' .. allowed .. ',', ',' .. current .. ',', 1, true) then
    local value = ARGV[first_value + i]
    if field ~= '' and value ~= '' then
      redis.call('HSET', key, F.STATUS, new_status, F.UPDATED_AT_MS, now, field, value)
    else
      redis.call('HSET', key, F.STATUS, new_status, F.UPDATED_AT_MS, now)
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
      finished[#finished + 1] = finished_entry(task_id, new_status, submitted, now, tenant, model, field, value)
    end
    moved[#moved + 1] = i
    moved[#moved + 1] = tenant
    moved[#moved + 1] = idem
  end
end
publish_finished(channel, finished)
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
)


class Transitions:
    """Moves tasks between states (see the module's docstring)."""

    def __init__(
        self, redis: RedisClient, keys: RedisKeys, stats_key: str, ttl_s: int, waiting_ttl_s: int, cluster: bool
    ) -> None:
        """``ttl_s``: how long a final task's record is kept; ``waiting_ttl_s``: an
        unfinished one's; ``stats_key``: the shared counters' hash."""
        self._redis = redis
        self._keys = keys
        self._stats_key = stats_key
        self._ttl_s = ttl_s
        self._waiting_ttl_s = waiting_ttl_s
        self._cluster = cluster
        self._transition = redis.register_script(_TRANSITION_LUA)

    async def move(
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
        """Move those of ``task_ids`` whose status is in ``allowed_from`` (comma-separated)
        to ``status``, writing ``field`` with each one's value (""; none); returns the ids
        moved. ``publish``: send the finished-tasks message; ``counters`` are added to the
        shared counters and ``moved_counter`` gains the number moved."""
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
            await self._after_move_on_cluster(moved, status, ttl, counters, moved_counter)
        return [task_id for task_id, _, _ in moved]

    async def _after_move_on_cluster(
        self,
        moved: list[tuple[str, str, bytes]],
        status: TaskStatus,
        ttl: int,
        counters: Mapping[str, int],
        moved_counter: str,
    ) -> None:
        """On a cluster, what the script could not do in its own slot: the tenants' in-flight
        sets left and Idempotency-Keys' lives set for final moves, the counters added. A
        crash before this leaves an in-flight entry until the task, read again and found
        final, takes it out (TaskStore.leave_in_flight_if_final); the counters stay short."""
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


def _by_slot(keys: list[str]) -> list[list[int]]:
    """The positions of ``keys`` grouped by hash slot, in first-seen order."""
    groups: dict[int, list[int]] = {}
    for position, key in enumerate(keys):
        groups.setdefault(key_slot(key.encode()), []).append(position)
    return list(groups.values())
