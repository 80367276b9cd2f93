# What bench/gpu_machine.sh needs before it runs anything, on a lent GPU machine that has its own
# CUDA torch and no network: the wheels carried in .whl/ (`make gpu-wheels`) and Trellis from this
# tree installed into $TRELLIS_SITE, PYTHONPATH pointed there, torch's GPU and every import the
# bench needs checked. Sourced (from the tree's root), so that a one-off command can follow it:
#
#   source bench/gpu_install.sh && "$PY" -m pytest -m cuda tests/...
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
