"""The shared core: what every Brimful process uses, and no room's own logic.

Settings (``settings``) and the policy's parameters read from them (``policy_params``);
the Redis key layout (``redis_keys``) and the stores built on it: task state
(``task_store``, with ``task_record``, ``admission`` and ``idempotency_keys``),
``stats``, ``status_board``, ``policy_tuning``, ``api_keys``, ``tenant_limits`` (with the
rate buckets); client factories (``redis_client``, its commands framed by hiredis, with
the pub/sub follower; ``kafka``) and the fetch wait fitted to a slow broker
(``fetch_wait``, ``fetch_pacer``); the model's metadata (``model_metadata``) and the
catalogue of models served with their signatures and tensors (``model_catalogue``);
metrics, logs, the clock, a shutdown step bounded in time (``shutdown_step``), and keeping
start-up objects out of the garbage collector's full passes (``heap``). It imports no
room.
"""
