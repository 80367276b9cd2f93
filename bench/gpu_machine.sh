#!/usr/bin/env bash
# `make bench-gpu` on a lent GPU machine that has its own CUDA torch and no network: install
# what the image lacks from wheels carried in .whl/ (`make gpu-wheels` fetches them, on a
# machine with pip's network), install Trellis beside them, check that torch sees a GPU and
# that every import the bench needs works, then run bench/gpu.py with the image's python3.
# The results file is copied to $OUT when that is set (the device tool brings $OUT back).
#
#   bash bench/gpu_machine.sh [bench/gpu.py options, e.g. --budget 500 --parts chem sweep]
#
# The datasets: bench/gpu_common.py reads ../shared/data/tu, or shared/data/tu inside the tree
# when the copy of the tree carries it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SITE=${TRELLIS_SITE:-/tmp/trellis-site}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl
fi
# Trellis itself, built from this tree (setuptools from the image; no build isolation: no network).
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade \
    --target "$SITE" .
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PY" - <<'PYCHECK'
import importlib, sys
import torch
missing = []
for name in ("trellis.silo.cli", "trellis.coordinator.cli", "tenseal", "cryptography",
             "grpc_health.v1", "dp_accounting.pld", "google.protobuf", "typer", "scipy"):
    try:
        importlib.import_module(name)
    except Exception as exc:                    # each missing piece named, all at once
        missing.append(f"{name}: {exc}")
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}, GPU: "
      f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
if missing:
    sys.exit("missing for the bench (carry their wheels in .whl/, `make gpu-wheels`):\n  "
             + "\n  ".join(missing))
PYCHECK
status=0
"$PY" bench/gpu.py "$@" || status=$?
if [ -n "${OUT:-}" ]; then
    for made in bench/results/gpu.json bench-run/gpu-quick.json; do
        if [ -f "$made" ]; then cp "$made" "$OUT/"; fi
    done
fi
exit $status
