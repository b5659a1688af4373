"""Brimful's benchmarks, the studies beside them, and the harness they share.

- ``bench/*.py``: the headline benchmarks, each run from the repository's root:
  ``.venv/bin/python -m bench.throughput`` (``make bench``), ``-m bench.scale``
  (``make bench-scale``), ``-m bench.sustained``, ``-m bench.front_door``.
- ``bench/studies/``: one question each (does the cost mode fill? what does a batch job do
  to interactive calls?), run the same way: ``-m bench.studies.cost_burst``.
- ``bench/harness/``: the library they import: the load generator (run in processes of its
  own as ``-m bench.harness.loadgen``), its HTTP client, the floor server, the saved report,
  process CPU and memory.

What they measured lands in ``bench/results/``; the log of what was tried is there too.
"""
