"""The GPU side, driven by the batcher: ``BatchRunner`` takes a batch, pads it to the
model's fixed size (``padding``), calls the model (``triton_model``), unpads, stores every
result, retries by failure class (``model_errors``, ``retry_policy``) behind a circuit
breaker (``circuit_breaker``), isolates failing rows within each tenant's
``isolation_budget``, and writes what still fails to the DLQ (``dead_letters``)."""
