"""Brimful: fills fixed-size GPU inference batches from single requests.

This package is the top floor: the ``brimful`` command (``brimful.cli``, ``brimful.commands``)
and the embedded local stack (``brimful.stack``), which assemble every room. The rooms
install beneath it, each from its own folder of the repository:

- ``brimful.api``: the HTTP front door process;
- ``brimful.batcher``: the per-partition batcher process (flush policy, offsets);
- ``brimful.workers``: the GPU side the batcher drives (padding, the Triton client,
  retries, the circuit breaker, dead letters);
- ``brimful.model_server``: what runs inside the model server (the reference model,
  MiniLM, the PyTriton host, the Triton repository server);
- ``brimful.core``: what the processes share (settings, Redis layout and stores, Kafka
  clients, metrics, logs, the tensor codec);
- ``brimful.schemas``: the wire contracts.

docs/architecture.md draws the rooms and the path of a task.
"""
