"""The GPU side, driven by the batcher: ``BatchRunner`` (``batch_runner``) takes a batch
(the types in ``batch``), calls the model padded to its fixed size (``triton_model``) on a
slot of the endpoint pool (``model_pool``, ``endpoint_pool`` with each endpoint's circuit
breaker, ``slot``), unpads and stores every result. Identical tasks share one row
(``shared_rows``, with the result cache); a refused batch's failing rows are isolated
within each tenant's ``isolation_budget`` and fail with their dead letters
(``task_failures``, ``dead_letters``); failures are retried by class (``model_errors``,
``retry_policy``)."""
