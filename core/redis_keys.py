"""The Redis key layout: the only place key names are spelled."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RedisKeys:
    """Builds every Redis key Brimful uses, under one prefix.

    Keys one command or transaction must reach together share a hash tag (the part in
    ``{}``), so they share a hash slot on a Redis Cluster: the policy and its history, and
    the batchers' status keys (read with one MGET). Every other command or script touches
    one key, except a batch's state change, which the task store splits by slot.

    - ``{prefix}:task:{task_id}``: hash with the task's status, timestamps, outputs or error.
    - ``{prefix}:stats``: hash of counters totalled across every batcher of the default
      model; ``{prefix}:stats:model:{model}`` those of another model.
    - ``{{prefix}:policy}``: hash of the default model's flush-policy parameters changed
      at run time; ``{{prefix}:policy}:model:{model}`` another model's.
    - ``{{prefix}:policy}:history`` (``...:model:{model}:history``): list of those
      changes, newest first (JSON).

    A model's own keys take ``model``: None for the default model, whose keys keep the
    names of a Brimful that serves one model (``Settings.model_scope`` says which).
    - ``{{prefix}:batcher}:{member}``: one live batcher's status (JSON, short TTL).
    - ``{{prefix}:batcher}``: set of the members that wrote a status, so a reader finds
      them without scanning the keyspace (a member whose status expired is dropped by
      the next reader).
    - ``{prefix}:dlq:resolved``: hash of DLQ entry id -> what on-call did to it (JSON).
    - ``{prefix}:dlq:task:{task_id}``: set of the DLQ entry ids (places) of a task's dead
      letters (``core/dead_letter_index.py``).
    - ``{prefix}:dlqlimit:{tenant}``: the tenant's token bucket for DLQ calls.
    - ``{prefix}:tombstone:{task_id}``: why a task must never run, though its Kafka record
      may be read (again): ``cancelled``, or ``withdrawn`` (its client was told it was not
      accepted). Kept as long as an unfinished task's record.
    - ``{prefix}:idempotency:{key}``: the task_id an Idempotency-Key was first used for.
    - ``{prefix}:ratelimit:{tenant}``: the tenant's token bucket (tokens, time).
    - ``{prefix}:apikeys``: hash of SHA-256(API key) -> its record (JSON); never a key.
    - ``{prefix}:apikeys:revoked`` (pub/sub channel): the id of each key as it is revoked.
    - ``{prefix}:tenantlimits``: hash of tenant -> its own limits (JSON), where set.
    - ``{prefix}:inflight:{tenant}``: sorted set of the tenant's unfinished task ids,
      scored by submission time (ms).
    - ``{prefix}:unconfirmed``: sorted set of the tasks recorded as queued whose
      submission the broker has not answered yet (``{task_id} {tenant}``), scored by when
      each was recorded (ms) (``core/admission.py``).
    - ``{prefix}:finished`` (pub/sub channel): task ids, as each reaches a final state.
    - ``{prefix}:cancelled`` (pub/sub channel; ``...:model:{model}`` another model's): task
      ids cancelled while queued.
    - ``{prefix}:slots:{endpoint}``: sorted set of the leases batchers hold on a model
      endpoint's slots, scored by when each expires (ms, Redis's clock);
      ``{prefix}:slots:model:{model}:{endpoint}`` another model's.
    - ``{prefix}:endpoint-down`` (pub/sub channel; ``...:model:{model}`` another model's):
      an endpoint whose circuit a batcher just opened.
    - ``{prefix}:file:{file_id}``: hash with an uploaded or written file's owner, name,
      size and purpose (the bytes are in the object store); ``{prefix}:files:{tenant}``:
      sorted set of the tenant's file ids by creation time; ``{prefix}:files-bytes``: hash
      of tenant -> the bytes of its files; ``{prefix}:uploadlimit:{tenant}``: its bucket of
      uploads (tokens, time).
    - ``{prefix}:batch:{batch_id}``: hash with a batch job's record;
      ``{prefix}:batch:{batch_id}:pending``: hash of its lines running now (line number ->
      their task ids); ``{prefix}:batch:{batch_id}:lease``: which API worker drives it;
      ``{prefix}:batches:{tenant}``: sorted set of the tenant's jobs by creation time;
      ``{prefix}:batches-active``: sorted set of the jobs not yet final.
    - ``{{prefix}:webhook}:endpoint:{id}`` (hash) and ``...:endpoints:{tenant}`` (set): a
      tenant's webhook endpoints; ``...:delivery:{id}``: one delivery's record;
      ``...:due``: sorted set of deliveries by next attempt (ms); ``...:log:{tenant}`` and
      ``...:dead:{tenant}``: a tenant's latest and dead deliveries;
      ``...:callback-secret:{tenant}``: what signs its tasks' callbacks;
      ``...:endpoints-version``: a counter every endpoint change moves. One hash tag for all.
    """

    prefix: str = "brimful"

    def task(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}"

    def file(self, file_id: str) -> str:
        return f"{self.prefix}:file:{file_id}"

    def tenant_files(self, tenant: str) -> str:
        return f"{self.prefix}:files:{tenant}"

    @property
    def file_expiry(self) -> str:
        """The files that expire, scored by when (Unix seconds)."""
        return f"{self.prefix}:files-expiry"

    def batch(self, batch_id: str) -> str:
        return f"{self.prefix}:batch:{batch_id}"

    def batch_pending(self, batch_id: str) -> str:
        return f"{self.prefix}:batch:{batch_id}:pending"

    def batch_lease(self, batch_id: str) -> str:
        return f"{self.prefix}:batch:{batch_id}:lease"

    def tenant_batches(self, tenant: str) -> str:
        return f"{self.prefix}:batches:{tenant}"

    @property
    def active_batches(self) -> str:
        return f"{self.prefix}:batches-active"

    # Webhooks: one hash tag, so a delivery's record, the due set and the logs move together.
    def webhook_endpoint(self, endpoint_id: str) -> str:
        return f"{{{self.prefix}:webhook}}:endpoint:{endpoint_id}"

    def webhook_endpoints(self, tenant: str) -> str:
        return f"{{{self.prefix}:webhook}}:endpoints:{tenant}"

    def webhook_delivery(self, delivery_id: str) -> str:
        return f"{{{self.prefix}:webhook}}:delivery:{delivery_id}"

    @property
    def webhook_due(self) -> str:
        return f"{{{self.prefix}:webhook}}:due"

    def webhook_log(self, tenant: str) -> str:
        return f"{{{self.prefix}:webhook}}:log:{tenant}"

    def webhook_dead(self, tenant: str) -> str:
        return f"{{{self.prefix}:webhook}}:dead:{tenant}"

    @property
    def webhook_endpoints_version(self) -> str:
        return f"{{{self.prefix}:webhook}}:endpoints-version"

    def webhook_callback_secret(self, tenant: str) -> str:
        return f"{{{self.prefix}:webhook}}:callback-secret:{tenant}"

    def tombstone(self, task_id: str) -> str:
        return f"{self.prefix}:tombstone:{task_id}"

    @property
    def stats(self) -> str:
        return f"{self.prefix}:stats"

    @property
    def policy(self) -> str:
        return f"{{{self.prefix}:policy}}"

    def model_stats(self, model: str | None) -> str:
        """The batching counters of one model (None: the default model)."""
        return self.stats if model is None else f"{self.stats}:model:{model}"

    def model_policy(self, model: str | None) -> str:
        """The live policy of one model (None: the default model)."""
        return self.policy if model is None else f"{self.policy}:model:{model}"

    def model_policy_history(self, model: str | None) -> str:
        return f"{self.model_policy(model)}:history"

    def rate_bucket(self, tenant: str) -> str:
        return f"{self.prefix}:ratelimit:{tenant}"

    def read_bucket(self, tenant: str) -> str:
        return f"{self.prefix}:readlimit:{tenant}"

    @property
    def api_keys(self) -> str:
        return f"{self.prefix}:apikeys"

    @property
    def revoked_keys_channel(self) -> str:
        """Where a revoked API key's id is announced, so every API process forgets it."""
        return f"{self.prefix}:apikeys:revoked"

    @property
    def tenant_limits(self) -> str:
        return f"{self.prefix}:tenantlimits"

    def in_flight(self, tenant: str) -> str:
        return f"{self.in_flight_prefix}{tenant}"

    @property
    def in_flight_prefix(self) -> str:
        """What ``in_flight(tenant)`` puts before the tenant (the transition script needs it)."""
        return f"{self.prefix}:inflight:"

    @property
    def unconfirmed(self) -> str:
        return f"{self.prefix}:unconfirmed"

    @property
    def finished_channel(self) -> str:
        return f"{self.prefix}:finished"

    @property
    def cancelled_channel(self) -> str:
        return f"{self.prefix}:cancelled"

    def model_cancelled_channel(self, model: str | None) -> str:
        """Where a task of one model cancelled while queued is announced (None: the
        default model's): only that model's batchers hear it."""
        return self.cancelled_channel if model is None else f"{self.cancelled_channel}:model:{model}"

    @property
    def endpoint_down_channel(self) -> str:
        """Where a batcher announces a model endpoint whose circuit it just opened."""
        return f"{self.prefix}:endpoint-down"

    def model_endpoint_down_channel(self, model: str | None) -> str:
        """The same for one model's batchers (None: the default model's): a model missing
        from one server says nothing of another model there."""
        return self.endpoint_down_channel if model is None else f"{self.endpoint_down_channel}:model:{model}"

    @property
    def dlq_resolved(self) -> str:
        return f"{self.prefix}:dlq:resolved"

    def dead_letter_places(self, task_id: str) -> str:
        return f"{self.prefix}:dlq:task:{task_id}"

    def upload_bucket(self, tenant: str) -> str:
        return f"{self.prefix}:uploadlimit:{tenant}"

    @property
    def stored_bytes(self) -> str:
        return f"{self.prefix}:files-bytes"

    def dlq_bucket(self, tenant: str) -> str:
        return f"{self.prefix}:dlqlimit:{tenant}"

    def idempotency(self, key: str) -> str:
        return f"{self.prefix}:idempotency:{key}"

    def batcher_status(self, member: str) -> str:
        return f"{{{self.prefix}:batcher}}:{member}"

    @property
    def batcher_members(self) -> str:
        return f"{{{self.prefix}:batcher}}"

    def endpoint_slots(self, endpoint: str, model: str | None = None) -> str:
        """Leases on one model's slots of an endpoint (None: the default model's): each
        model has its own instances on a server, so its own slots."""
        return f"{self.prefix}:slots:{endpoint}" if model is None else f"{self.prefix}:slots:model:{model}:{endpoint}"
