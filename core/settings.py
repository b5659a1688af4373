"""Every setting Brimful reads, in one place.

Each field is overridable by an environment variable named ``BRIMFUL_`` plus the
field name in capitals (``max_wait_ms`` -> ``BRIMFUL_MAX_WAIT_MS``). The defaults
run the embedded local stack on loopback; production overrides addresses and
enables the broker features Tansu lacks.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from brimful.core.topic_generations import SUFFIX, TopicGenerations

# A model's name goes into a topic's name and Redis keys: Kafka's topic characters only.
MODEL_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


# Marks a setting the operator may change on a running system (``PATCH /v1/admin/policy``).
LIVE: dict[str, Any] = {"tunable": True}


class Settings(BaseSettings):
    """Typed, documented settings shared by the API, the batcher and the workers."""

    model_config = SettingsConfigDict(env_prefix="BRIMFUL_", extra="ignore")

    # --- Kafka -----------------------------------------------------------------------
    kafka_bootstrap: str = Field(
        "127.0.0.1:9092", description="Comma-separated bootstrap servers of the Kafka-protocol broker."
    )
    kafka_idempotence: bool = Field(
        False,
        description="Idempotent producer. Turn on against Apache Kafka; Tansu cannot start one.",
    )
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="How clients reach the broker: PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL."
    )
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "SCRAM-SHA-512", description="SASL mechanism with the SASL_* protocols."
    )
    kafka_sasl_username: str = Field("", description="SASL user (needed by the SASL_* protocols).")
    kafka_sasl_password: SecretStr = Field(SecretStr(""), description="SASL password; never logged.")
    kafka_ssl_cafile: str = Field(
        "", description="CA bundle (PEM) that signs the broker's certificate; empty: the system's trust store."
    )
    kafka_ssl_certfile: str = Field("", description="Client certificate (PEM) for brokers that require mutual TLS.")
    kafka_ssl_keyfile: str = Field("", description="Private key (PEM) of the client certificate.")
    requests_topic: str = Field("brimful.requests", description="Topic the API writes accepted tasks to.")
    dlq_topic: str = Field("brimful.dlq", description="Dead-letter topic for tasks that exhausted their retries.")
    topic_partitions: int = Field(
        1,
        ge=1,
        description="Partitions of the requests topic when Brimful creates it. Each has its own accumulator, "
        "so each fills from its share of the traffic: use about as many as there are batchers.",
    )
    topic_replication: int = Field(1, ge=1, description="Replication factor when Brimful creates topics.")
    topic_rotation_s: float = Field(
        0.0,
        ge=0,
        description="0: each model's tasks go to one requests topic for ever (Apache Kafka keeps it bounded by its "
        "own retention). Otherwise tasks go to a new generation of the topic (<topic>.g<N>) every this many seconds, "
        "and batchers delete a generation once it is finished: for a broker without retention (the embedded one "
        "keeps every record, and its fetches slow as they pile up). At least 5. Keep it short there: at 80% of "
        "saturation the embedded broker held 10 minutes at 10, and fell behind within a minute at 60. "
        "`brimful up` (make up) takes 10 unless this is given.",
    )
    topic_rotation_grace_s: float = Field(
        30.0,
        gt=0,
        description="How long after its end a topic generation is kept before it may be deleted: it covers sends "
        "begun before the end and hosts' clocks that disagree. At least kafka_request_timeout_ms plus 10 s.",
    )
    consumer_group: str = Field("brimful-batchers", description="Consumer group shared by all batchers.")
    kafka_session_timeout_ms: int = Field(
        6000,
        ge=1000,
        description="Group session timeout: how soon a dead batcher's partitions move. Apache Kafka refuses a "
        "group member below its group.min.session.timeout.ms (6000 by default); the embedded Tansu takes 3000.",
    )
    kafka_heartbeat_interval_ms: int = Field(500, ge=100, description="Consumer heartbeat interval.")
    kafka_request_timeout_ms: int = Field(
        10000, ge=1000, description="Kafka request timeout; must exceed session timeout / 2 (JoinGroup is held)."
    )
    kafka_commit_timeout_s: float = Field(
        5.0, gt=0, description="Upper bound on one offset commit, so a broker fault cannot hang the batcher."
    )
    kafka_commit_every_ms: int = Field(
        100,
        ge=0,
        le=10_000,
        description="Shortest time between a batcher's offset commits: the commits of batches finishing within it "
        "go as one. A batcher that dies re-reads at most this much finished work, which it skips (those tasks "
        "are final). At 20 ms, commits were 4.6% of the batcher's profile at saturation.",
    )
    kafka_commit_after_stored_ms: int = Field(
        0,
        ge=0,
        le=60_000,
        description="How long after a batch's results are stored in Redis its offsets may be committed. 0 with Redis "
        "syncing every write (appendfsync always, the embedded default); with appendfsync everysec (compose, most "
        "production Redis) 2000: a kill loses up to its last second or so, and the records of the tasks it lost are "
        "then read again, re-created and computed, instead of lost with their committed offsets.",
    )
    kafka_fetch_max_wait_ms: int = Field(
        5,
        ge=0,
        description="Longest a fetch waits on the broker for data. Small here, because the embedded broker "
        "(Tansu in memory mode) holds a fetch for its wait even when records arrive: with a steady stream a "
        "record reached the batcher 7.5 ms after its send at 20 ms and 3.8 ms at 5. Apache Kafka answers on "
        "arrival, so with it this only paces fetches of an idle topic (compose and the Helm chart use 100). "
        "Tansu on S3 storage needs 500 or more: shorter, its fetches come back empty.",
    )
    kafka_fetch_lagging_max_wait_ms: int = Field(
        4000,
        ge=0,
        description="Ceiling of the fetch wait while a partition lags and fetches still come back empty: "
        "the wait doubles from kafka_fetch_max_wait_ms up to this, and returns once caught up. A broker "
        "that reads old records slowly (Tansu on S3 after a restart) gives a short fetch nothing, and "
        "answers a long one just after its wait: at most half of kafka_request_timeout_ms, so a fetch held "
        "for its whole wait comes back in time.",
    )
    kafka_linger_ms: int = Field(
        0,
        ge=0,
        description="Producer linger: how long a send waits to share a request. 0, because the API's group commit "
        "already hands the producer the submissions that arrive together, which go in one request; a linger "
        "would only delay each of them.",
    )
    kafka_max_message_bytes: int = Field(
        1_048_588,
        ge=4096,
        description="Largest record the broker accepts (Apache Kafka's message.max.bytes, whose default this is). "
        "Where the broker names a lower max.message.bytes for the requests or DLQ topic, read at start, that wins. "
        "A task whose record would be larger is refused with 413; a dead letter that would be larger is written "
        "without the request's inputs, saying so.",
    )

    # --- Redis -----------------------------------------------------------------------
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis holding task state and results.")
    redis_cluster: bool = Field(
        False,
        description="Redis is a Redis Cluster: redis_url names any one of its nodes, and the others are found "
        "from it. Each task's record lives in its own hash slot (see docs/operations.md, Redis Cluster).",
    )
    result_ttl_s: int = Field(3600, ge=1, description="How long a finished task's state and result are kept.")
    task_provenance: bool = Field(
        True,
        description="Store each done task's provenance with its outputs (its batch, rows, flush reason, endpoint "
        "and where its time went; GET /v1/tasks/{id} shows it), in the same Redis step. Read by the batchers.",
    )
    redis_admission_memory_ratio: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Share of Redis's maxmemory past which the API refuses new work (503 store_full): the rest is "
        "left for storing the results of tasks already accepted. No effect on a Redis without maxmemory.",
    )
    result_ttl_after_read_s: int = Field(
        600,
        ge=0,
        description="How long a finished task's result is kept once a client has read it (never longer than "
        "result_ttl_s), so Redis holds the unread results, not the traffic. 0: the full result_ttl_s.",
    )
    task_wait_ttl_s: int = Field(
        7 * 24 * 3600,
        ge=1,
        description="How long an unfinished task's record is kept (queued or running): far beyond any backlog, so "
        "a task never expires while it waits in Kafka.",
    )
    key_prefix: str = Field("brimful", description="Prefix of every Redis key Brimful writes.")
    redis_timeout_s: float = Field(
        2.0,
        gt=0,
        le=60,
        description="Longest one Redis command, or a connection to Redis, may take: past it the command fails (the "
        "API answers 503 with Retry-After, a batcher runs its batch again), so a paused or wedged Redis holds no "
        "request. A command that timed out is not repeated by the client (it may have run). Brimful's slowest "
        "command (a batch's state change) takes milliseconds.",
    )
    redis_max_connections: int = Field(64, ge=1, description="Redis connections per process; more requests queue.")
    redis_pool_timeout_s: float = Field(
        5.0, gt=0, description="How long a request waits for a free Redis connection before failing."
    )

    # --- Triton ----------------------------------------------------------------------
    triton_url: str = Field(
        "127.0.0.1:8001",
        description="Triton gRPC endpoints of the model pool, comma-separated host:port (one per GPU or node).",
    )
    triton_resolve_dns: bool = Field(
        False,
        description="Resolve each endpoint's host name to all its addresses, one endpoint each (a Kubernetes "
        "headless Service), and re-resolve every endpoint_resolve_s without a restart.",
    )
    endpoint_resolve_s: float = Field(10.0, gt=0, description="How often endpoint names are re-resolved.")
    endpoint_capacity: int = Field(
        2,
        ge=1,
        le=64,
        description="Concurrent calls each endpoint is sent at most: endpoint_instances, plus queueing slots so "
        "the next batch's hand-over overlaps the running call.",
    )
    endpoint_instances: int = Field(
        1,
        ge=1,
        le=64,
        description="Calls each endpoint runs at once (its model instance count). The flush policy counts an "
        "endpoint busy once this many calls run there; slots beyond it (endpoint_capacity) only queue the next "
        "batch, sent just before a call ends.",
    )
    slot_wait_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="Longest a batch waits for a model slot while some endpoint serves; past it the batch is run "
        "again (and given up to the DLQ if that keeps happening). Every call is bounded by infer_timeout_s, so "
        "slots that do not move for this long are held by a fault. A batcher whose slots have not moved for "
        "twice this while rows wait fails its liveness probe.",
    )
    endpoint_leases: bool = Field(
        True,
        description="Batchers lease endpoint slots in Redis, so several batchers together never send an endpoint "
        "more concurrent calls than endpoint_capacity.",
    )
    triton_http_port: int = Field(
        8000, ge=1, le=65535, description="HTTP port of the Triton server the embedded stack starts."
    )
    triton_metrics_port: int = Field(
        8002, ge=1, le=65535, description="Metrics port of the Triton server the embedded stack starts."
    )
    models: str = Field(
        "",
        description="Models this Brimful serves, comma-separated; the first is the default, for tasks that name "
        "none. Empty: model_name alone. Each model's tasks have their own topic (the default's is requests_topic, "
        "another's requests_topic.<model>) and their own batcher (started with BRIMFUL_MODEL_NAME=<model>).",
    )
    model_name: str = Field(
        "brimful_reference",
        description="Model this batcher sends its batches to (one of models); with models empty, the one model served.",
    )
    model_version: str = Field(
        "", description="Version of model_name; empty means the server's default (which other models always get)."
    )
    batch_size: int = Field(
        64,
        ge=1,
        description="Rows a call of the reference model the embedded stack serves. Brimful itself reads "
        "each model's batch size from the model's configuration.",
    )
    infer_timeout_s: float = Field(10.0, gt=0, description="Timeout of one model call.")
    result_cache_max_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="Results each batcher keeps for identical tasks (same model, version, inputs and tenant), least "
        "recently used out first; 0 keeps none (identical tasks of one batch are still computed once).",
    )
    result_cache_across_tenants: bool = Field(
        False,
        description="Let one tenant's task be answered by another tenant's identical task. Off: a result never "
        "crosses tenants (see docs/security.md).",
    )
    shortenable_embedding_models: str = Field(
        "",
        description="Embedding models trained so that a vector's leading dimensions keep their meaning "
        "(Matryoshka), comma-separated: POST /v1/embeddings answers them any dimensions up to their own, "
        "cut and scaled back to unit length. Any other model answers only its own.",
    )
    uncacheable_models: str = Field(
        "",
        description="Models whose results are never shared, comma-separated (not deterministic): each task is "
        "computed on its own.",
    )

    # --- Batching policy (see docs/batching.md) --------------------------------------
    # The policy's knobs are declared here once: default, bounds, what each does, and
    # whether it is tuned live (LIVE). core/policy_params.py reads them from here. The
    # upper bounds keep a typo from parking every batch for a day.
    max_wait_ms: float = Field(
        250.0,
        gt=0,
        le=60_000,
        json_schema_extra=LIVE,
        description="No request waits longer than this for its batch to fill.",
    )
    min_wait_ms: float = Field(
        2.0,
        ge=0,
        le=60_000,
        json_schema_extra=LIVE,
        description="No batch leaves before its oldest row waited this long, unless it is full.",
    )
    latency_target_ms: float = Field(
        105.0,
        gt=0,
        le=60_000,
        json_schema_extra=LIVE,
        description="Submit-to-result time the policy aims to keep (the one knob of docs/batching.md): while a "
        "model slot is free it waits for more rows only when they are expected within this target, less the "
        "fitted call time and the measured time a task spends before the batcher and after its call. At or "
        "above max_wait_ms it is the cost mode: fill first, every batch leaves full or at its latest. 105: at mid load a GPU-like model's calls then carry "
        "the dynamic batcher's rows for about its latency (docs/batching.md).",
    )
    rate_halflife_ms: float = Field(
        500.0, gt=0, le=600_000, json_schema_extra=LIVE, description="Half-life of the EWMA arrival-rate estimate."
    )
    fill_slack: float = Field(
        1.25,
        ge=1.0,
        le=10,
        json_schema_extra=LIVE,
        description="Deadline = slack x expected time to fill the empty slots.",
    )
    min_worthwhile_rows: float = Field(
        8.0,
        ge=0,
        le=1_000_000,
        json_schema_extra=LIVE,
        description="Wait past min_wait only if the time left to wait is expected to add this many rows "
        "(an eighth of a 64-row batch): fewer are not worth delaying the rows already waiting.",
    )
    low_max_wait_ms: float = Field(
        30000.0,
        gt=0,
        le=3_600_000,
        json_schema_extra=LIVE,
        description="A low-priority row waits at most this long for a slot no normal row needs (batcher/accumulator.py); "
        "then it queues as a normal row. The bound on how long low-priority work can starve.",
    )
    max_in_flight_per_partition: int = Field(
        2, ge=1, description="Batches of one partition at the model at once (one fills while one runs)."
    )
    max_in_flight: int = Field(8, ge=1, description="Batches at the model at once, across partitions.")
    max_pending_per_partition: int = Field(
        512, ge=1, description="Rows a partition may hold unflushed before its fetching pauses."
    )
    max_low_pending_per_partition: int = Field(
        20000,
        ge=1,
        description="Low-priority rows a partition may hold before its fetching pauses: read ahead so normal rows "
        "behind a bulk backlog in the log are not stuck behind it (about 1 KB of memory each).",
    )

    tuning_poll_ms: int = Field(
        500, ge=50, description="How often batchers re-read live-tuned policy parameters from Redis."
    )
    trace_dir: str = Field(
        "", description="Directory where batchers record arrival traces (Parquet) for `brimful simulate`; empty: off."
    )
    batcher_metrics_port: int = Field(
        9108,
        ge=0,
        le=65535,
        description="Port of the batcher's HTTP server: Prometheus /metrics, /healthz, /readyz and /status; 0: not served.",
    )
    batcher_metrics_host: str = Field(
        "127.0.0.1",
        description="Address the batcher's /metrics and probes bind to: 0.0.0.0 in a container, so Prometheus and "
        "the kubelet reach them.",
    )

    # --- Retries ---------------------------------------------------------------------
    max_attempts: int = Field(3, ge=1, description="Model calls per batch before its tasks fail to the DLQ.")
    retry_backoff_ms: float = Field(100.0, ge=0, description="First retry delay; doubles per attempt.")
    retry_backoff_max_ms: float = Field(2000.0, ge=0, description="Cap on the retry delay.")
    transient_give_up_s: float = Field(
        900.0, gt=0, description="An outage of the model longer than this fails its batches to the DLQ."
    )
    breaker_failure_threshold: int = Field(
        3, ge=1, description="Transient failures in a row that open the model endpoint's circuit."
    )
    breaker_max_open_s: float = Field(5.0, gt=0, description="Longest wait between probes of an unreachable model.")
    tenant_isolation_burst: int = Field(
        200,
        ge=0,
        description="Model calls a tenant's refused rows may cost to find which of them fail (halving and retries "
        "alone), per batcher; beyond it, that tenant's refused rows fail to the DLQ at once. 0: no bound.",
    )
    tenant_isolation_calls_per_s: float = Field(
        1.0, gt=0, description="How fast a tenant's isolation budget refills, in model calls per second."
    )

    # --- API -------------------------------------------------------------------------
    api_host: str = Field("127.0.0.1", description="Address the API listens on.")
    api_port: int = Field(8080, ge=1, le=65535, description="Port the API listens on.")
    api_workers: int = Field(
        1,
        ge=1,
        le=64,
        description="API worker processes sharing the port (the API is CPU-bound: about one per spare core); "
        "/metrics sums their counters.",
    )
    api_read_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Longest a client may take to send a request: its headers (else 408 and the connection is "
        "closed), its body (else 408 request_timeout), and its first byte after connecting (else the "
        "connection is closed). Bounds what slow or idle clients hold.",
    )
    api_max_connections: int = Field(
        2048,
        ge=1,
        description="Requests under way in one API worker (long-polls included), and connections it holds open: a "
        "connection past it closes the longest-idle one, and only when none is idle does a new request get 503 "
        "too_many_connections with Retry-After (never /healthz or /readyz). Keep it below the process's open-files "
        "limit.",
    )
    api_direct_lane: bool = Field(
        True,
        description="Answer POST /v1/tasks and GET /v1/tasks/{id} inside the HTTP protocol, past ASGI: no scope, no "
        "Starlette request or response, one write an answer; the same handlers, checks and answers. Requests it "
        "does not take (an Origin header, Expect: 100-continue, tracing on) go the ASGI way, through FastAPI. Off: every "
        "request through FastAPI (to compare).",
    )
    max_body_bytes: int = Field(
        1_000_000,
        ge=1,
        description="Largest accepted request body. The default leaves a task of text inputs room for its record's "
        "fields under the broker's default message limit.",
    )
    auth_enabled: bool = Field(
        True, description="Require `Authorization: Bearer <key>` (keys from `brimful keys`). `brimful up` turns it off."
    )
    api_key_cache_s: float = Field(
        5.0,
        ge=0,
        le=300,
        description="How long an API process trusts a key it looked up before reading it from Redis again. A "
        "revocation reaches every API process at once (a Redis channel); this bounds how long one can go unheard "
        "if that message is lost. 0: read the key from Redis on every request.",
    )
    rate_limit_per_s: float = Field(
        1000.0, ge=0, description="Tasks per second each tenant may submit (token bucket); 0: no limit."
    )
    rate_limit_burst: int = Field(5000, ge=1, description="How many tasks a tenant may submit at once, above the rate.")
    rate_limit_lease_ms: float = Field(
        10.0,
        ge=0,
        le=1000,
        description="How far ahead an API process takes a tenant's tokens (tasks, reads, DLQ calls, uploads): this "
        "long at the tenant's rate, admitted from without a Redis round trip, dropped if not used within it. Never "
        "more than the bucket holds (a token is taken before it is used), and only from the upper half of the "
        "bucket, so a tenant under its rate is never refused for what leases dropped. Below two tokens (a rate "
        "under 200 a second at 10 ms) nothing is taken ahead. 0: one round trip a request.",
    )
    read_rate_limit_per_s: float = Field(
        5000.0,
        ge=0,
        description="Reads (GET, long-poll, DELETE of a task) per second each tenant may make; 0: no limit.",
    )
    read_rate_limit_burst: int = Field(
        10_000, ge=1, description="How many reads a tenant may make at once, above the rate."
    )
    dlq_rate_limit_per_s: float = Field(
        5.0,
        ge=0,
        description="DLQ admin calls (list, show, replay, purge, export) per second each tenant may make; "
        "0: no limit. A call that reads the topic costs a broker consumer.",
    )
    dlq_rate_limit_burst: int = Field(
        50, ge=1, description="How many DLQ admin calls a tenant may make at once, above the rate."
    )
    dlq_read_max_letters: int = Field(
        20_000,
        ge=1,
        description="Most dead letters one DLQ call reads from the topic: a page past it ends early and answers "
        "where the next one starts, and the first page's count says it is partial. Entries named by id are read at "
        "their places and do not count.",
    )
    tenant_max_long_polls: int = Field(
        1000,
        ge=0,
        description="Most requests of one tenant held waiting (`?wait=`) at once in one API process before its "
        "submissions stop waiting: beyond it a POST is answered 202 at once. A GET follow-up of the tenant's own "
        "task is held all the same (bounded by api_max_connections). 0: no limit.",
    )
    api_allowed_hosts: str = Field(
        "",
        description="Host names an open stack (auth off) answers besides loopback ones, comma-separated: any other "
        "Host is refused 403, so a web page cannot reach the API through a name it makes resolve to loopback (DNS "
        "rebinding). With auth on, every Host is answered.",
    )
    api_cors_origins: str = Field(
        "",
        description="Web origins (scheme://host[:port]) whose pages may call the API, comma-separated; they get CORS "
        "answers. Empty: CORS off, and a write from any page of another origin is refused 403.",
    )
    api_key: str = Field("", description="Key the `brimful` operator commands present to the API.")
    long_poll_max_s: float = Field(30.0, gt=0, description="Longest `?wait=` a client may ask a request to be held.")
    max_bulk_tasks: int = Field(
        2048,
        ge=1,
        description="Most tasks one request may create: a POST /v1/tasks:batch's tasks, a POST /v1/embeddings' "
        "inputs (2,048: OpenAI's limit of inputs a call).",
    )
    embedding_token_encoding: Literal["cl100k_base", ""] = Field(
        "cl100k_base",
        description="The vocabulary in which POST /v1/embeddings reads an input sent as token ids (what "
        "LangChain's OpenAIEmbeddings sends by default), decoded to the text the model takes. Empty: token ids "
        "are refused with 400.",
    )
    submit_group_max: int = Field(
        256,
        ge=1,
        description="Most submissions one group commit records in Redis and sends to the broker together "
        "(submissions that arrive while a group is written form the next one).",
    )
    submit_group_gap_ms: float = Field(
        0.0,
        ge=0,
        le=50,
        description="Least time between the starts of an API process's group commits for one model. A submission "
        "that finds the last group begun longer ago than this goes at once (a quiet API adds nothing); under load "
        "the submissions of the gap join one group, one Redis round trip and one record batch. A broker whose "
        "fetches slow with every stored record batch (the embedded one) needs it at high rates.",
    )
    submit_groups_unacknowledged: int = Field(
        1,
        ge=0,
        le=64,
        description="Most of an API process's group commits for one model sent to the broker and not yet "
        "acknowledged; the next group waits for the oldest answer, gathering what arrives meanwhile. With arrivals "
        "spread (an open loop), groups then grow with the broker's answer time rather than a timer: fewer Redis "
        "round trips and produce requests a task. A lone submission still goes at once. 0: no bound (a group "
        "starts as soon as the last is recorded).",
    )
    submit_waiting_max: int = Field(
        10_000,
        ge=1,
        description="Most submissions an API process holds waiting for their group; past it, 503 overloaded.",
    )
    tenant_max_payload_bytes: int = Field(
        1024 * 1024,
        ge=0,
        description="Default largest task payload (its encoded inputs) a tenant may submit; "
        "`brimful tenants set` overrides it per tenant. 0: only max_body_bytes applies.",
    )
    tenant_max_in_flight: int = Field(
        10_000,
        ge=0,
        description="Default most tasks a tenant may have accepted and unfinished at once (429 beyond); "
        "`brimful tenants set` overrides it per tenant. 0: no limit.",
    )
    max_backlog: int = Field(
        100_000,
        ge=1,
        description="Accepted but unfinished tasks (consumer lag: queued, waiting or at the model) above which "
        "POST answers 503 with Retry-After.",
    )

    # --- Files and batch jobs (OpenAI's Files and Batch APIs; docs/openai.md) ----------
    file_store_url: str = Field(
        ".brimful/files",
        description="Where uploaded files and batch results live: a folder (path or file:///path), or "
        "s3://bucket/prefix with pyarrow's options in the query (?endpoint_override=host:port&scheme=http for an "
        "S3-compatible server); S3 credentials from the standard AWS_* variables. Every API worker must reach it.",
    )
    file_max_bytes: int = Field(200 * 1024 * 1024, ge=1, description="Largest file POST /v1/files takes.")
    file_upload_max_s: float = Field(
        900.0,
        gt=0,
        description="Longest one upload may take from its first byte to its last (408 past it), however steadily "
        "it trickles: 200 MiB at 250 KB/s.",
    )
    file_uploads_per_tenant: int = Field(
        4, ge=1, description="Uploads one tenant may have under way at once in one API worker (429 past it)."
    )
    file_upload_rate_per_s: float = Field(
        1.0, ge=0, description="Uploads per second each tenant may start, across workers; 0: no limit."
    )
    file_upload_burst: int = Field(20, ge=1, description="How many uploads a tenant may start at once, above the rate.")
    file_sweep_interval_s: float = Field(
        300.0,
        gt=0,
        description="How often one API worker removes stored objects nothing points to (uploads cut by a crash, "
        "files without a record, parts of ended jobs), once older than twice file_upload_max_s.",
    )
    tenant_max_stored_bytes: int = Field(
        10 * 1024**3,
        ge=0,
        description="Default most bytes of files a tenant may keep (its uploads and its batch jobs' results; 413 "
        "past it); `brimful tenants set` overrides it per tenant. 0: no limit.",
    )
    batch_max_lines: int = Field(50_000, ge=1, description="Most lines a batch job's input file may hold.")
    batch_max_active_per_tenant: int = Field(
        100,
        ge=1,
        description="Most batch jobs one tenant may have not yet ended (past it, 429): the API's drivers take "
        "jobs one tenant at a time in turn, and 1,000 active jobs at most across tenants.",
    )
    batch_job_window: int = Field(
        512,
        ge=1,
        description="Most tasks of one batch job unfinished at once: a job's lines are submitted as earlier ones "
        "finish, so it never fills the queue ahead of interactive tasks or reaches its tenant's in-flight limit.",
    )

    # --- Webhooks (Standard Webhooks; docs/openai.md) -----------------------------------
    webhook_allowed_hosts: str = Field(
        "",
        description="Host names webhooks may be sent to though they resolve to this network's addresses (loopback, "
        "private, link-local), comma-separated. Empty: only hosts whose every address is public.",
    )
    webhook_retry_delays_s: str = Field(
        "5,300,1800,7200,18000,36000,36000,36000,36000,36000,36000",
        description="Waits between a delivery's attempts, seconds, comma-separated; after the last, or once "
        "webhook_retry_window_s has passed since the event, the delivery is dead (listed for on-call to replay).",
    )
    webhook_retry_window_s: float = Field(
        259200.0,
        gt=0,
        description="How long a delivery is retried (72 h, as OpenAI's); each wait is spread by a "
        "fifth either way, and a receiver's Retry-After is honoured.",
    )
    webhook_secret_overlap_s: float = Field(
        86400.0,
        ge=0,
        description="How long an endpoint's old secret still signs its deliveries, beside the new "
        "one, after POST /v1/webhooks/endpoints/{id}/rotate-secret.",
    )
    webhook_callback_payload: Literal["full", "thin"] = Field(
        "full",
        description="What a delivery to a task's own callback_url carries: full (the task as GET /v1/tasks/{id} "
        "shows it) or thin (its id, model, status and times; the receiver reads the rest). Endpoints choose theirs.",
    )
    webhook_disable_after_s: float = Field(
        259200.0,
        gt=0,
        description="How long an endpoint's deliveries may fail, none delivered, before the "
        "endpoint is disabled (and the tenant's endpoints that take webhook_endpoint.disabled are told).",
    )
    webhook_timeout_s: float = Field(
        10.0, gt=0, description="Longest one attempt may take, connecting and answering included."
    )

    # --- Tracing (OpenTelemetry; see core/tracing.py) --------------------------------
    tracing_enabled: bool = Field(
        False, description="Trace each task from its POST through Kafka to the model call (needs the tracing extra)."
    )
    tracing_otlp_endpoint: str = Field(
        "http://127.0.0.1:4318/v1/traces", description="Where spans go: an OTLP/HTTP traces endpoint (a collector)."
    )
    tracing_sample_ratio: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Share of new traces recorded; a caller's traceparent decides for the traces it starts.",
    )

    @model_validator(mode="after")
    def _check_consistency(self) -> Settings:
        # The policy's rules are PolicyParams' (imported here: it reads its defaults from
        # this class): settings that break them fail at start, in every process.
        from brimful.core.policy_params import PolicyParams

        PolicyParams.from_knobs({name: getattr(self, name) for name in PolicyParams.knobs()}, batch_size=1)
        if self.max_in_flight_per_partition > self.max_in_flight:
            raise ValueError("max_in_flight_per_partition must not exceed max_in_flight")
        if self.endpoint_instances > self.endpoint_capacity:
            raise ValueError("endpoint_instances must not exceed endpoint_capacity")
        return self

    @model_validator(mode="after")
    def _check_kafka(self) -> Settings:
        if self.kafka_request_timeout_ms <= self.kafka_session_timeout_ms // 2:
            raise ValueError("kafka_request_timeout_ms must exceed kafka_session_timeout_ms / 2")
        # A broker that reads old records slowly holds a fetch for its whole wait and answers
        # just after it: a fetch must come back well within the request timeout, or it times
        # out, looks empty, and the same fetch is asked again for ever.
        if (
            not self.kafka_fetch_max_wait_ms
            <= self.kafka_fetch_lagging_max_wait_ms
            <= self.kafka_request_timeout_ms / 2
        ):
            raise ValueError(
                "kafka_fetch_lagging_max_wait_ms must be at least kafka_fetch_max_wait_ms and at most half of "
                "kafka_request_timeout_ms (a fetch held for its whole wait must come back in time)"
            )
        if 0 < self.topic_rotation_s < 5:
            raise ValueError("topic_rotation_s must be 0 (no rotation) or at least 5")
        if self.topic_rotation_s and self.topic_rotation_grace_s < self.kafka_request_timeout_ms / 1000 + 10:
            # A send begun just before its generation ended may still land until its
            # request times out: the generation must outlive it.
            raise ValueError("topic_rotation_grace_s must be at least kafka_request_timeout_ms plus 10 s")
        if self.kafka_security_protocol.startswith("SASL_") and not (
            self.kafka_sasl_username and self.kafka_sasl_password.get_secret_value()
        ):
            raise ValueError(
                f"kafka_security_protocol {self.kafka_security_protocol} needs kafka_sasl_username and kafka_sasl_password"
            )
        if bool(self.kafka_ssl_certfile) != bool(self.kafka_ssl_keyfile):
            raise ValueError("kafka_ssl_certfile and kafka_ssl_keyfile go together")
        return self

    @model_validator(mode="after")
    def _check_models(self) -> Settings:
        names = self.served_models
        if len(set(names)) != len(names):
            raise ValueError(f"models names a model twice: {self.models!r}")
        for name in names:
            if not MODEL_NAME.fullmatch(name):
                raise ValueError(f"model name {name!r} is not 1-64 of A-Z a-z 0-9 . _ -")
        if self.model_name not in names:
            raise ValueError(f"model_name {self.model_name!r} is not one of models ({', '.join(names)})")
        if not self.triton_endpoints:
            raise ValueError("triton_url names no endpoint")
        for endpoint in self.triton_endpoints:
            host, _, port = endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"triton_url entry {endpoint!r} is not host:port")
        return self

    @model_validator(mode="after")
    def _check_webhooks(self) -> Settings:
        try:
            delays = self.webhook_delays_s
        except ValueError as error:
            raise ValueError(f"webhook_retry_delays_s is not numbers: {self.webhook_retry_delays_s!r}") from error
        if not delays or any(delay < 0 for delay in delays):
            raise ValueError("webhook_retry_delays_s needs at least one wait of 0 s or more")
        return self

    @property
    def webhook_delays_s(self) -> list[float]:
        """``webhook_retry_delays_s`` as numbers."""
        return [float(part) for part in comma_list(self.webhook_retry_delays_s)]

    @property
    def served_models(self) -> list[str]:
        """The models served, the default first (``models`` split on commas, or model_name)."""
        return comma_list(self.models) or [self.model_name]

    @property
    def cors_origins(self) -> list[str]:
        """``api_cors_origins`` as origins, each without a trailing slash."""
        return [origin.rstrip("/") for origin in comma_list(self.api_cors_origins)]

    @property
    def allowed_hosts(self) -> list[str]:
        """``api_allowed_hosts`` as a list."""
        return comma_list(self.api_allowed_hosts)

    @property
    def webhook_hosts(self) -> frozenset[str]:
        """``webhook_allowed_hosts``, lower-cased: hosts a webhook or callback may reach
        though they resolve inside the network."""
        return frozenset(host.lower() for host in comma_list(self.webhook_allowed_hosts))

    @property
    def default_model(self) -> str:
        """The model a task that names none is sent to."""
        return self.served_models[0]

    def cacheable(self, model: str) -> bool:
        """Whether identical tasks of ``model`` may share one result."""
        return model not in comma_list(self.uncacheable_models)

    def shortenable(self, model: str) -> bool:
        """Whether the embedding model ``model`` answers shorter ``dimensions`` (declared so)."""
        return model in comma_list(self.shortenable_embedding_models)

    def model_scope(self, model: str) -> str | None:
        """What a model's own topic, group and Redis keys carry: None for the default
        model, whose keep the names of a Brimful serving one model, so one that gains a
        second model keeps its topic, backlog, counters and tuning."""
        return None if model == self.default_model else model

    def requests_topic_for(self, model: str) -> str:
        """The topic of one model's tasks (the default's is ``requests_topic``)."""
        scope = self.model_scope(model)
        return self.requests_topic if scope is None else f"{self.requests_topic}.{scope}"

    def topic_generations_for(self, model: str) -> TopicGenerations:
        """The generations of one model's requests topic (one topic without rotation).
        Batchers join a generation half a period, at most 10 s, before it starts."""
        return TopicGenerations(
            self.requests_topic_for(model),
            self.topic_rotation_s,
            lead_s=min(10.0, self.topic_rotation_s / 2),
            grace_s=self.topic_rotation_grace_s,
        )

    def consumer_group_for(self, model: str, generation: int | None = None) -> str:
        """The consumer group of one model's batchers (the default's is ``consumer_group``)."""
        scope = self.model_scope(model)
        group = self.consumer_group if scope is None else f"{self.consumer_group}.{scope}"
        # A generation's own group: joining the next one never rebalances the current one.
        return group if generation is None or not self.topic_rotation_s else f"{group}{SUFFIX}{generation}"

    @property
    def triton_endpoints(self) -> list[str]:
        """The model pool's endpoints as configured (``triton_url`` split on commas)."""
        return comma_list(self.triton_url)


def comma_list(text: str) -> list[str]:
    """A comma-separated setting's entries, each stripped, the empty ones dropped: the one
    way every list setting is read."""
    return [part.strip() for part in text.split(",") if part.strip()]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read from the environment once."""
    return Settings()


def changed_settings(settings: Settings, **changes: Any) -> Settings:
    """``settings`` with ``changes``, checked as a process's start checks them: a pydantic
    copy checks nothing, and a change that breaks a rule (a rotation without the grace it
    needs) would only fail later, in every child given these settings. The fields counted
    as given stay those given, and the changed ones."""
    checked = type(settings).model_validate({**settings.model_dump(), **changes})
    return settings.model_copy(update={name: getattr(checked, name) for name in changes})


def default_of(name: str) -> Any:
    """A setting's default, where code needs it without Settings built (one source)."""
    return Settings.model_fields[name].default
