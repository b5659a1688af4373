# Two commands do all the set-up on a fresh machine:
#   make up    install what is missing, then run the embedded stack (Ctrl-C stops it)
#   make test  install what is missing, then run the whole test suite
# and `make bench` runs the throughput benchmark (bench/throughput.py) into bench/results/.
.PHONY: up test bench bootstrap schemas

bootstrap:
	@scripts/bootstrap

up: bootstrap
	.venv/bin/brimful up

test: bootstrap
	.venv/bin/python -m pytest $(PYTEST_ARGS)

bench: bootstrap
	.venv/bin/python bench/throughput.py $(BENCH_ARGS)

schemas: bootstrap
	PATH=.venv/bin:$$PATH scripts/gen-schemas
