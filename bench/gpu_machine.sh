#!/usr/bin/env bash
# `make bench-gpu` on a lent GPU machine that has its own CUDA torch and no network: install
# what the image lacks from wheels carried in .whl/ (`make gpu-wheels` fetches them, on a
# machine with pip's network), install Trellis beside them, check that torch sees a GPU and
# that every import the bench needs works, then run bench/gpu.py with the image's python3.
# The results file is copied to $OUT when that is set (the device tool brings $OUT back).
#
#   bash bench/gpu_machine.sh [bench/gpu.py options, e.g. --budget 500 --parts chem sweep]
#
# The record's commit: the machine's copy of the tree may carry stale git metadata, so name it
# from here: TRELLIS_BENCH_COMMIT=$(git rev-parse --short HEAD) in the device call's command.
#
# The datasets: bench/gpu_common.py reads ../shared/data/tu, or shared/data/tu inside the tree
# when the copy of the tree carries it.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/gpu_install.sh
source bench/gpu_install.sh
status=0
"$PY" bench/gpu.py "$@" || status=$?
if [ -n "${OUT:-}" ]; then
    for made in bench/results/gpu.json bench-run/gpu-quick.json; do
        if [ -f "$made" ]; then cp "$made" "$OUT/"; fi
    done
fi
exit $status
