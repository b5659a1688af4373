"""The shared core: what every Brimful process uses, and no room's own logic.

Settings (``settings``) and the policy's parameters read from them (``policy_params``);
the Redis key layout (``redis_keys``) and the stores built on it: task state
(``task_store``, with ``transitions``, ``admission``, ``task_record``,
``finished_message`` and ``idempotency_keys``), ``stats``, ``status_board``,
``policy_tuning``, ``api_keys``, ``tenant_limits``; client factories (``redis_client``,
with commands framed by hiredis in ``redis_packing``; ``kafka``) and the
fetch wait fitted to a slow broker (``fetch_wait``, ``fetch_pacer``); the model's signature
and metadata (``model_signature``, ``model_metadata``) and the catalogue of models served
(``model_catalogue``); the tensor codec; metrics, logs, the clock, the pub/sub follower,
a shutdown step bounded in time (``shutdown_step``), and keeping start-up objects out of
the garbage collector's full passes (``heap``). It imports no room.
"""
