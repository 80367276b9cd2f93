# Two entry points for newcomers: `make demo` (a real federation on this machine) and
# `make test` (the whole suite). Both create or reuse the virtual environment in .venv.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.trellis-installed

.PHONY: demo test protos check-protos lint bench clean

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

clean:
	rm -rf demo-run bench-run .pytest_cache
