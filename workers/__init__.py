"""The GPU side, driven by the batcher: ``BatchRunner`` (``batch_runner``) takes a batch
(the types in ``batch``), pads it to the model's fixed size (``padding``), calls the model
(``triton_model``) on a slot of the endpoint pool (``model_pool``, ``endpoint_pool``,
``slot``), unpads and stores every result. Identical tasks share one row (``shared_rows``,
``result_cache``); a refused batch's failing rows are isolated (``isolation``) within each
tenant's ``isolation_budget`` and fail with their dead letters (``task_failures``,
``dead_letters``); failures are retried by class (``model_errors``, ``retry_policy``)
behind a circuit breaker per endpoint (``circuit_breaker``)."""
