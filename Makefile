# Two commands do all the set-up on a fresh machine:
#   make up    install what is missing, then run the embedded stack (Ctrl-C stops it)
#   make test  install what is missing, then run the whole test suite
# and `make bench` runs the throughput benchmark (bench/throughput.py) into bench/results/;
# `make soak` runs the chaos soak for SOAK_S seconds (default 600) into docs/reliability.md.
.PHONY: up test bench soak bootstrap schemas

SOAK_S ?= 600

bootstrap:
	@scripts/bootstrap

up: bootstrap
	.venv/bin/brimful up

test: bootstrap
	.venv/bin/python -m pytest $(PYTEST_ARGS)

soak: bootstrap
	BRIMFUL_SOAK_S=$(SOAK_S) BRIMFUL_SOAK_REPORT=docs/reliability.md .venv/bin/python -m pytest -q -s tests/faults/test_chaos_soak.py

bench: bootstrap
	.venv/bin/python bench/throughput.py $(BENCH_ARGS)

schemas: bootstrap
	PATH=.venv/bin:$$PATH scripts/gen-schemas
