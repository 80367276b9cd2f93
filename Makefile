# Two entry points for newcomers: `make demo` (a real federation on this machine) and
# `make test` (the whole suite). Both create or reuse the virtual environment in .venv.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.trellis-installed

.PHONY: demo test protos check-protos lint bench bench-speed bench-secagg clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: an unpinned torch pulls several GB of CUDA packages.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" bash deploy/demo.sh

test: $(STAMP)
	$(PY) -m pytest -q

protos: $(STAMP)
	$(PY) protos/generate.py

check-protos: $(STAMP)
	$(PY) protos/generate.py --check

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy silo coordinator crypto protos/codec.py protos/messages.py

bench: $(STAMP)
	$(PY) bench/fedstar_chem.py

bench-speed: $(STAMP)
	$(PY) bench/speed_chem.py

# Secure aggregation against Flower's SecAgg+, in a separate environment (Flower pins
# protobuf < 7): `make bench-secagg` for the full grid, `make bench-secagg ARGS=--quick`.
BENCH_VENV := .venv-bench
$(BENCH_VENV)/.ready: bench/requirements-flower.txt
	test -x $(BENCH_VENV)/bin/python || python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q -r bench/requirements-flower.txt
	$(BENCH_VENV)/bin/pip install -q --no-deps flwr==1.42.0
	touch $@

bench-secagg: $(BENCH_VENV)/.ready
	$(BENCH_VENV)/bin/python bench/secagg_vs_flower.py $(ARGS)

clean:
	rm -rf demo-run bench-run .pytest_cache
