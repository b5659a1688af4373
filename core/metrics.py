"""Every Prometheus metric Brimful exports, named in one place.

Each process (API, batcher) exports its own on ``/metrics``; Prometheus sums across
processes. Several API workers on one port answer together: their counters are summed
through prometheus_client's multiprocess mode. Labels: ``partition`` where the value belongs to one partition's accumulator,
``endpoint`` for the model server a batch went to. A batcher serves one model, and its
``/metrics`` adds ``model`` to every sample (``core/metrics_exposition.py``); the API, which
serves them all, names the model where a value belongs to one.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Where API workers share their metrics when there are several (prometheus_client's
# multiprocess mode reads it at import, so the API sets it before starting workers).
MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

_ROW_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 60, 63, 64)
_WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.5, 1.0, 2.5, 5.0)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)

# --- batcher: the accumulators -------------------------------------------------------
FLUSHES = Counter("brimful_flushes", "Batches flushed from an accumulator, by reason.", ["partition", "reason"])
QUEUE_WAIT = Histogram(
    "brimful_queue_wait_seconds",
    "Time a row waited in its accumulator before its batch left.",
    ["partition"],
    buckets=_WAIT_BUCKETS,
)
FLUSH_DEADLINE = Gauge(
    "brimful_flush_deadline_seconds",
    "Wait budget the policy gives the partition's current batch (0 when nothing waits).",
    ["partition"],
)
ARRIVAL_RATE = Gauge(
    "brimful_arrival_rate_per_second", "Estimated arrival rate of the partition (EWMA).", ["partition"]
)
PENDING_ROWS = Gauge("brimful_pending_rows", "Rows waiting in the partition's accumulator.", ["partition"])
CONSUMER_LAG_ROWS = Gauge(
    "brimful_consumer_lag_rows",
    "Records of the partition not yet finished and committed (high watermark less committed offset).",
    ["partition"],
)
CONSUMER_LAG_SECONDS = Gauge(
    "brimful_consumer_lag_seconds",
    "How far behind the partition's head the batcher is in time: the age of its oldest waiting row, or, "
    "while records wait unfetched in the broker, of the last record it fetched; 0 when caught up.",
    ["partition"],
)
POLICY_LATENCY_TARGET = Gauge(
    "brimful_policy_latency_target_seconds", "The flush policy's latency target, as this batcher applies it now."
)
POLICY_MAX_WAIT = Gauge(
    "brimful_policy_max_wait_seconds", "Longest a row waits for its batch to fill, as this batcher applies it now."
)
ASSIGNED_PARTITIONS = Gauge(
    "brimful_batcher_assigned_partitions", "Partitions of the requests topic this batcher owns."
)
OFFSET_GAPS_REREAD = Counter(
    "brimful_offset_gaps_reread",
    "Fetches that skipped offsets of the partition and were read again from the first skipped one "
    "(a record the broker had numbered but could not yet serve).",
    ["partition"],
)
FETCH_WAIT = Gauge(
    "brimful_fetch_wait_seconds",
    "Longest the broker may hold the consumer's next fetch: raised while it lags behind a slow broker.",
    ["consumer"],
)

# --- every process -------------------------------------------------------------------
GC_FROZEN_OBJECTS = Gauge(
    "brimful_gc_frozen_objects",
    "Objects this process kept from start-up and moved out of the garbage collector's full passes "
    "(core/heap.py); 0 until start-up is over (of several API workers, the least).",
    multiprocess_mode="livemin",
)

_PARTITION_GAUGES = (FLUSH_DEADLINE, ARRIVAL_RATE, PENDING_ROWS, CONSUMER_LAG_ROWS, CONSUMER_LAG_SECONDS)


def forget_partition(partition: str) -> None:
    """Drop a partition's gauges when this batcher gives it up, so no stale value lingers."""
    for gauge in _PARTITION_GAUGES:
        try:
            gauge.remove(partition)
        except KeyError:
            pass


# --- workers: model calls ------------------------------------------------------------
BATCH_ROWS = Histogram(
    "brimful_batch_rows", "Real rows (padding excluded) in each model call.", ["partition"], buckets=_ROW_BUCKETS
)
PADDED_SLOTS = Counter("brimful_padded_slots", "Filler rows sent to reach the fixed batch size.", ["partition"])
TASKS_RECREATED = Counter(
    "brimful_tasks_recreated",
    "Tasks whose Redis record was gone when their batch ran (Redis lost it), re-created from their Kafka record.",
)
WEBHOOK_ATTEMPTS = Counter(
    "brimful_webhook_attempts",
    "Webhook delivery attempts, by outcome: delivered, failed (tried again later) or dead.",
    ["outcome"],
)
WEBHOOK_ENDPOINTS_DISABLED = Counter(
    "brimful_webhook_endpoints_disabled",
    "Webhook endpoints disabled: their receiver answered 410 Gone, or their deliveries failed for "
    "webhook_disable_after_s.",
)
TASKS_EXPIRED = Counter(
    "brimful_tasks_expired",
    "Tasks whose deadline (deadline_ms) passed before they were sent to the model: never computed.",
)
CACHE_HITS = Counter(
    "brimful_cache_hits",
    "Tasks answered by an identical task's result (cached or computed beside them), no row of their own.",
)
CACHE_MISSES = Counter("brimful_cache_misses", "Cacheable tasks the model computed.")
CACHE_BYTES = Gauge("brimful_cache_bytes", "Bytes the result cache holds (its entries' JSON plus overhead).")
ISOLATION_CALLS = Counter("brimful_isolation_calls", "Extra model calls made on split batches to isolate failing rows.")
MODEL_CALLS = Counter("brimful_model_calls", "Model calls, by outcome.", ["endpoint", "outcome"])
IN_FLIGHT = Gauge("brimful_batches_in_flight", "Batches holding a slot of the endpoint right now.", ["endpoint"])
ENDPOINT_CAPACITY = Gauge(
    "brimful_endpoint_capacity", "Concurrent calls the endpoint serves well (its slots).", ["endpoint"]
)
ENDPOINT_CALL_SECONDS = Gauge(
    "brimful_endpoint_call_seconds", "Fitted time of one full-batch call to the endpoint.", ["endpoint"]
)
ENDPOINT_BREAKER = Gauge(
    "brimful_endpoint_breaker_state", "The endpoint's circuit: 0 closed, 1 half-open, 2 open.", ["endpoint"]
)
ENDPOINT_ROWS = Counter("brimful_endpoint_rows", "Real rows the endpoint computed.", ["endpoint"])
MODEL_RETRIES = Counter(
    "brimful_model_retries",
    "Model calls made again after a failure, by kind: transient (endpoint away) or model_error (the batch refused).",
    ["kind"],
)
DEAD_LETTERS = Counter(
    "brimful_dead_letters",
    "Tasks written to the dead-letter topic, by model and error class.",
    ["model", "error_class"],
)
BATCH_STAGE = Histogram(
    "brimful_batch_stage_seconds",
    "Where a batch's time goes, one observation per batch and stage: to_batcher (its rows' mean submit-to-fetch: "
    "the API's write and the Kafka hop), in_batch (their mean wait in the accumulator), prepare (flush to the "
    "call: marking the tasks running, the slot's lease, padding), call (the model call), store (call end to "
    "results stored).",
    ["stage"],
    buckets=_WAIT_BUCKETS,
)
TASK_LATENCY = Histogram(
    "brimful_task_latency_seconds", "Submit-to-result time of tasks that completed.", buckets=_LATENCY_BUCKETS
)

# --- API -----------------------------------------------------------------------------
CONNECTIONS_SHED = Counter(
    "brimful_connections_shed",
    "Idle connections an API worker closed to make room past api_max_connections.",
)
TASKS_SUBMITTED = Counter("brimful_tasks_submitted", "Tasks accepted (answered 202), by model.", ["model"])
UNCONFIRMED_RELEASED = Counter(
    "brimful_unconfirmed_tasks_released",
    "Tasks recorded and never confirmed (their API stopped first, or Redis lost the confirmation), taken out "
    "of their tenants' tasks in flight by the sweep (api/tasks/group_commit.py).",
)
SUBMIT_GROUP_SIZE = Histogram(
    "brimful_submit_group_size",
    "Submissions recorded and sent together by one group commit.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)
HTTP_RESPONSES = Counter(
    "brimful_http_responses", "HTTP answers, by route template and status code.", ["route", "status"]
)
REFUSALS = Counter(
    "brimful_refusals",
    "Requests refused for load or size, by reason (the error code: rate_limited, too_many_in_flight, overloaded, "
    "too_many_connections, body_too_large, ...).",
    ["reason"],
)
BACKLOG_ROWS = Gauge(
    "brimful_backlog_rows",
    "A model's accepted tasks not yet finished, as the API sees them.",
    ["model"],
    multiprocess_mode="max",
)
BACKLOG_LIMIT_ROWS = Gauge(
    "brimful_backlog_limit_rows",
    "The backlog of a model above which POST answers 503 overloaded for it.",
    multiprocess_mode="max",
)
LONG_POLLS_WAITING = Gauge(
    "brimful_long_polls_waiting", "Requests held open waiting for a task to finish.", multiprocess_mode="livesum"
)
LONG_POLLS_DECLINED = Counter(
    "brimful_long_polls_declined",
    "Submissions with ?wait= answered 202 at once instead of held, their tenant holding tenant_max_long_polls "
    "waiting requests in that API process already (a GET follow-up past it is held all the same).",
)
