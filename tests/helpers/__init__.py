"""What tests share, apart from fixtures (those live in the conftest files):

- ``stacks``: settings and stacks of their own on free ports, the production-shape and
  durable stacks the fault tests break, and what a stack's model saw;
- ``live_policy``: tune the live flush policy and wait until every batcher applies it;
- ``pipeline``: the reference model's expected outputs, random texts, dead letters and
  committed offsets read from the real broker;
- ``metrics``: Prometheus pages scraped from the API, batchers and Triton;
- ``fake_consumer``: the few calls a batcher makes of its Kafka consumer, for unit tests;
- ``fake_store``: a small model's signature, rows for it, and a task store that records,
  for unit tests of the GPU side;
- ``polling``: a poll with a deadline, instead of sleeps;
- ``task_client``: a small HTTP client of the task API;
- the servers and proxies some tests run: ``otlp_receiver``, ``prometheus_server``,
  ``slow_replies``, and ``redis_sends`` (counts the commands a client sends).
"""
