"""Brimful's benchmarks and the harness they share.

Each benchmark is a module run from the repository's root: ``.venv/bin/python -m
bench.throughput`` (what ``make bench`` runs), ``-m bench.scale`` (``make bench-scale``),
and the studies beside them. The harness modules (``loadgen``, ``raw_http``,
``saved_report``, ``process_usage``, ...) are imported by them, never run on their own but
for the load generator, which each benchmark starts in processes of its own
(``-m bench.loadgen``). What they measured lands in ``bench/results/``.
"""
