# Two commands do all the set-up on a fresh machine:
#   make up    install what is missing, then run the embedded stack (Ctrl-C stops it);
#              UP_ARGS=--kafka runs it on one Apache Kafka node instead of Tansu
#   make test  install what is missing, then run the whole test suite
# and, once set up:
#   make test-unit  the unit tests alone: pure logic, no server, under a minute
#   make check      ruff (lint and format) and mypy
#   make coverage   the unit tests' line coverage of the product, printed (CI runs it)
#   make bench      the throughput benchmark (bench/throughput.py) into bench/results/
#   make bench-scale  API workers x batchers x partitions x endpoints (bench/scale.py)
#                   (BENCH_ARGS passes flags: --broker kafka, or --brokers tansu,kafka for scale)
#   make soak       the chaos soak for SOAK_S seconds (default 600) into SOAK_REPORT;
#                   SOAK_BROKER=kafka runs it on three Apache Kafka nodes (default s3: Tansu)
.PHONY: up test test-unit coverage check bench bench-scale soak bootstrap schemas

SOAK_S ?= 600
SOAK_BROKER ?= $(or $(BRIMFUL_SOAK_BROKER),s3)
SOAK_REPORT ?= bench/results/soak.md

bootstrap:
	@scripts/bootstrap

up: bootstrap
	.venv/bin/brimful up $(UP_ARGS)

test: bootstrap
	.venv/bin/python -m pytest $(PYTEST_ARGS)

test-unit: bootstrap
	.venv/bin/python -m pytest -q -m unit $(PYTEST_ARGS)

coverage: bootstrap
	.venv/bin/python -m coverage run -m pytest -q -m unit $(PYTEST_ARGS)
	.venv/bin/python -m coverage report --sort=cover --skip-empty

check: bootstrap
	@scripts/check

soak: bootstrap
	BRIMFUL_SOAK_S=$(SOAK_S) BRIMFUL_SOAK_BROKER=$(SOAK_BROKER) BRIMFUL_SOAK_REPORT=$(SOAK_REPORT) \
		.venv/bin/python -m pytest -q -s tests/faults/test_chaos_soak.py

bench: bootstrap
	.venv/bin/python -m bench.throughput $(BENCH_ARGS)

bench-scale: bootstrap
	.venv/bin/python -m bench.scale $(BENCH_ARGS)

schemas: bootstrap
	PATH=.venv/bin:$$PATH scripts/gen-schemas
