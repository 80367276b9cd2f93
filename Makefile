# Two entry points for newcomers: `make demo` (a real federation on this machine) and
# `make test` (the whole suite). Both create or reuse the virtual environment in .venv.
# `make docs` builds the documentation site (docs/, mkdocs.yml) into build/site.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.trellis-installed
# The coordinator alone, installed without torch (`pip install 'trellis-fgl[privacy]'`: with the
# privacy accountant, so the slice's private plans run there too), in its own environment: the
# slice of the suite that covers it must pass there.
COORD_VENV ?= .venv-coordinator
COORD_STAMP := $(COORD_VENV)/.trellis-installed
COORDINATOR_TESTS := tests/unit/crypto tests/unit/protos tests/unit/coordinator \
	tests/integration/coordinator

.PHONY: demo test docs test-coordinator protos check-protos lint check-deploy deploy-check bench \
	bench-speed bench-secagg bench-secagg-memory bench-secagg-scale bench-prepared bench-gpu gpu-wheels \
	clean

# torch, installed first and pinned, from PyTorch's index for the build wanted: PyPI's Linux torch
# is the CUDA build, several GB of nvidia-* packages. CPU by default; a CUDA build with e.g.
# `make test TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128` (docs/getting-started.md).
TORCH_VERSION := 2.13.0
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
# Whether the index answers, within 10 s.
TORCH_INDEX_ANSWERS := $(PY) -c 'import sys, urllib.request as r; \
	r.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10)'

# The index is asked first: pip would retry one that does not answer for minutes (six tries of
# its --timeout, when a firewall drops the packets). Where it does not answer (a machine or CI
# that reaches only PyPI), torch comes from pip's other sources, with a warning: a CPU wheel the
# machine holds (pip's find-links), else PyPI's torch, the CUDA build on Linux.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	if $(TORCH_INDEX_ANSWERS) '$(TORCH_INDEX_URL)' 2>/dev/null; then \
		$(PY) -m pip install -q --index-url $(TORCH_INDEX_URL) torch==$(TORCH_VERSION); \
	else \
		echo "warning: $(TORCH_INDEX_URL) does not answer: torch $(TORCH_VERSION) from pip's" \
			"other sources (on Linux, PyPI's is the CUDA build)" >&2; \
		$(PY) -m pip install -q torch==$(TORCH_VERSION); \
	fi
	$(PY) -m pip install -q -e '.[silo,data,report,test,ray,docs]'
	touch $(STAMP)

$(COORD_STAMP): pyproject.toml
	test -x $(COORD_VENV)/bin/python || python3 -m venv $(COORD_VENV)
	$(COORD_VENV)/bin/python -m pip install -q --upgrade pip
	$(COORD_VENV)/bin/python -m pip install -q -e '.[privacy,report,test]'
	touch $(COORD_STAMP)

# The linters of deploy/ (Kubernetes manifests, Dockerfiles, YAML), pinned, in their own
# environment: checkov's many dependencies stay out of the project's. About 25 s to install.
TOOLS_VENV ?= .venv-tools
TOOLS_STAMP := $(TOOLS_VENV)/.ready
$(TOOLS_STAMP): deploy/requirements-tools.txt
	test -x $(TOOLS_VENV)/bin/python || python3 -m venv $(TOOLS_VENV)
	$(TOOLS_VENV)/bin/python -m pip install -q --upgrade pip
	$(TOOLS_VENV)/bin/python -m pip install -q -r deploy/requirements-tools.txt
	touch $@

demo: $(STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" bash deploy/demo.sh

# How `make test` runs pytest: on PYTEST_WORKERS pytest-xdist workers (`make test
# PYTEST_WORKERS=0` for one process). The tests mostly wait on processes and sockets, so a
# 2-core CI machine runs 4 workers well; tests that share a module-scoped fixture stay on one
# worker (--dist loadgroup, tests/support/worker_groups.py). The 20 slowest tests are listed.
PYTEST_WORKERS ?= 4
PYTEST_RUN := -n $(PYTEST_WORKERS) --dist loadgroup --durations=20

# The site, lint and layer contracts, the deploy/ checks and the coordinator's slice without torch
# first, two at a time (installing one environment leaves a core free for another step), then
# everything else alone (the slice's tests need nothing the full environment adds, and none of
# them may skip there: tests/conftest.py).
test:
	$(MAKE) --no-print-directory -j2 docs lint check-deploy test-coordinator
	$(PY) -m pytest -q $(PYTEST_RUN) $(addprefix --ignore=,$(COORDINATOR_TESTS))

test-coordinator: $(COORD_STAMP)
	TRELLIS_COORDINATOR_ONLY=1 $(COORD_VENV)/bin/python -m pytest -q $(PYTEST_RUN) \
		$(COORDINATOR_TESTS)

protos: $(STAMP)
	$(PY) protos/generate.py

check-protos: $(STAMP)
	$(PY) protos/generate.py --check

# mypy resolves the installed names (trellis.silo, ...) through a tree of links to the folders.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	mkdir -p build/typecheck/trellis
	for p in silo coordinator crypto protos; do ln -sfn ../../../$$p build/typecheck/trellis/$$p; done
	MYPYPATH=build/typecheck $(VENV)/bin/mypy -p trellis.silo -p trellis.coordinator \
		-p trellis.crypto -p trellis.protos
	$(VENV)/bin/lint-imports

# The site, strict: a broken link or anchor, a page in no navigation entry or an API reference that
# does not resolve fails the build. mkdocstrings reads the code statically (griffe, nothing
# imported) through a tree of links that gives the folders their installed names, as for mypy.
docs: $(STAMP)
	mkdir -p build/docs-src/trellis
	for p in silo coordinator crypto protos; do ln -sfn ../../../$$p build/docs-src/trellis/$$p; done
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# Render the Kubernetes manifests, yamllint, checkov, hadolint, systemd-analyze (deploy/check.sh).
check-deploy: $(TOOLS_STAMP)
	TOOLS=$(TOOLS_VENV) bash deploy/check.sh

# Build the images and run the compose federation in Docker (deploy/deploy-check.sh): minutes,
# root, Docker installed and started if need be; not part of `make test`.
deploy-check: $(STAMP)
	PY=$(PY) bash deploy/deploy-check.sh

bench: $(STAMP)
	$(PY) bench/fedstar_chem.py

# FedStar on MUTAG and PTC_MR from SMILES prepared with `silo data prepare` vs from their TU
# folders, 3 seeds (issue 36): about 2 minutes on 2 cores; needs ../shared/data/tu.
bench-prepared: $(STAMP)
	$(PY) bench/prepared_vs_tu.py

# The coordinator's memory for one secure aggregation against the number of silos.
bench-secagg-memory: $(STAMP)
	$(PY) bench/secagg_server_memory.py

# N real silos (protocol only, own certificates and TLS channels) against a real coordinator:
# per-stage time, coordinator peak memory and CPU, bytes per silo, exact sums. About 15 minutes
# on 2 cores; the full-graph protocol is left out where its N^2 masks would take hours.
bench-secagg-scale: $(STAMP)
	$(PY) bench/secagg_scale.py --skip bonawitz:100:1000000 bonawitz:200:1000000
	$(PY) bench/plot_scale.py

# AUTHORS=path/to/FedStar (yuetan031/FedStar at da01eac, outside this repository): their FedStar
# timed beside ours in the same run (bench/fedstar_authors.py).
bench-speed: $(STAMP)
	$(PY) bench/speed_chem.py $(if $(AUTHORS),--authors $(AUTHORS))

# Trellis on one GPU in one command, under 6 minutes on one H100 or H200 with 16 cores (issue 37):
# the CHEM table on the GPU and the CPU (with AUTHORS=path, the authors' FedStar too), 7 silos on
# one GPU (sequential engine vs Ray with GPU shares), a profile of a FedStar round's kernel
# launches and GPU-busy time, every algorithm plain and private as a real
# 3-silo federation on cuda, and the CUDA tests; bench/results/gpu.json names the device. Needs a
# CUDA build of torch in $(VENV) (TORCH_INDEX_URL above). Without a GPU,
# `python bench/gpu.py --device cpu --quick` runs the same pipeline on CPU with tiny settings.
# ARGS: more options, e.g. ARGS="--budget 500" or ARGS="--parts chem".
bench-gpu: $(STAMP)
	$(PY) bench/gpu.py $(if $(AUTHORS),--authors $(AUTHORS)) $(ARGS)

# The wheels a lent GPU machine (its own CUDA torch, Python 3.12, no network) lacks for
# bench/gpu_machine.sh, fetched here into .whl/ (ignored), to be carried there with the tree.
GPU_WHEELS := tenseal cryptography cffi pycparser grpcio==1.85.1 grpcio-health-checking==1.85.1 \
	protobuf==7.36.2 dp-accounting==0.6.0
gpu-wheels:
	mkdir -p .whl
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $(GPU_WHEELS)

# Secure aggregation against Flower's SecAgg+, in a separate environment (Flower pins
# protobuf < 7): `make bench-secagg` for the full grid, `make bench-secagg ARGS=--quick`.
BENCH_VENV := .venv-bench
$(BENCH_VENV)/.ready: bench/requirements-flower.txt pyproject.toml
	test -x $(BENCH_VENV)/bin/python || python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q -r bench/requirements-flower.txt
	$(BENCH_VENV)/bin/pip install -q --no-deps flwr==1.42.0
	# Trellis itself without its dependencies: the benchmark imports only trellis.crypto.
	$(BENCH_VENV)/bin/pip install -q --no-deps -e .
	touch $@

bench-secagg: $(BENCH_VENV)/.ready
	$(BENCH_VENV)/bin/python bench/secagg_vs_flower.py $(ARGS)

clean:
	rm -rf demo-run bench-run .pytest_cache build/typecheck build/check-deploy build/docs-src \
		build/site
