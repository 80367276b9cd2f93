"""The authors' FedStar code (yuetan031/FedStar at da01eac), run on CHEM for bench/speed_chem.py.

Their code is never copied into this repository: it is a checkout elsewhere (``--authors
PATH``), extracted from its git history with ``git archive da01eac``. This module only
prepares what it expects and times its rounds in this process, at one torch thread.

What it expects, and how it gets it here:

- The TU files under ``PATH/Data/TUDataset/<name>/raw/`` (PyG's ``TUDataset`` layout, their
  ``--datapath ./Data``). The shared copies are gzipped, so ``prepare_data`` writes them there
  decompressed, once.
- pandas and scikit-learn (``setupGC``/``utils`` import them; ``train_test_split`` makes their
  splits), which Trellis does not need: installed with their few pure dependencies into
  ``PATH/.deps`` (``make bench-speed AUTHORS=PATH`` does it, pinned) and put on ``sys.path``
  after the environment's own packages, so that numpy, scipy and torch stay ours.

Runtime shims, the only changes to how their code runs (none to its files):

- ``dgl`` (imported at the top of lib/utils.py, never used by FedStar) and ``dtaidistance``
  (lib/server.py, used only by GCFL's DTW clustering) are empty modules in ``sys.modules``: on
  this torch neither installs without pulling another torch.
- Nothing else was needed: their models, loaders and training loop run unchanged on torch
  2.13 and torch-geometric 2.8.

One timed round is exactly their ``run_fedstar`` loop body (lib/training.py): every client's
``local_train(1)`` (one epoch of mini-batches of 128, then their evaluation on the validation
and test sets, then four norms), ``aggregate_weights_se`` and the download to every client.
Left out: the extra test-set evaluation their loop runs every fifth round only for
TensorBoard, and TensorBoard itself.
"""

from __future__ import annotations

import argparse
import gzip
import random
import resource
import statistics
import sys
import time
import types
from pathlib import Path

CHEM = ("MUTAG", "BZR", "COX2", "DHFR", "PTC_MR", "AIDS", "NCI1")
# Their defaults (exps/main_multiDS.py) and README command for CHEM: --alg fedstar
# --type_init rw_dg --seed 1; the data split seed is fixed at 123 there.
SEED, SPLIT_SEED = 1, 123
# pandas and scikit-learn with the pure-Python packages they need beyond ours, pinned.
DEPENDENCIES = ("pandas==3.1.1", "scikit-learn==1.9.1", "joblib==1.6.0", "threadpoolctl==3.8.0",
                "cloudpickle==3.1.3", "narwhals==2.29.0")


def prepare_data(authors: Path, tu: Path) -> Path:
    """Their data folder: the CHEM TU files decompressed under ``Data/TUDataset/<name>/raw``."""
    data = authors / "Data"
    for name in CHEM:
        raw = data / "TUDataset" / name / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        for packed in sorted((tu / name).glob("*.txt.gz")):
            target = raw / packed.name.removesuffix(".gz")
            if not target.exists():
                target.write_bytes(gzip.decompress(packed.read_bytes()))
    return data


def _import_their_code(authors: Path) -> types.ModuleType:
    """Their lib/setupGC with the runtime shims above in place."""
    for name in ("dgl", "dtaidistance"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["dtaidistance"].dtw = None  # type: ignore[attr-defined]
    deps = authors / ".deps"
    if deps.is_dir() and str(deps) not in sys.path:
        sys.path.append(str(deps))           # after ours: numpy, scipy and torch stay ours
    lib = str(authors / "lib")
    if lib not in sys.path:
        sys.path.insert(0, lib)
    import setupGC  # type: ignore[import-not-found]
    return setupGC


def measure(authors: Path, rounds: int, device: str = "cpu",
            threads: int = 1) -> dict[str, float]:
    """In this process, on ``device`` with ``threads`` torch threads (default: the CPU, one):
    set up their 7 CHEM clients, time `rounds` rounds after one warm-up round; their mean
    validation and test accuracy after the last one are reported as a sanity check."""
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    setup_gc = _import_their_code(authors)
    args = argparse.Namespace(
        device=device, alg="fedstar", num_rounds=rounds + 1, local_epoch=1, lr=0.001,
        weight_decay=5e-4, nlayer=3, hidden=64, dropout=0.5, batch_size=128, seed=SEED,
        datapath=str(authors / "Data"), data_group="chem", n_rw=16, n_dg=16, n_ones=16,
        type_init="rw_dg")
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    start = time.perf_counter()
    data, _ = setup_gc.prepareData_multiDS(args, args.datapath, args.data_group,
                                           args.batch_size, seed=SPLIT_SEED)
    args.n_se = args.n_rw + args.n_dg
    clients, server, _ = setup_gc.setup_devices(data, args)
    setup = time.perf_counter() - start
    for client in clients:
        client.download_from_server(args, server)
    times = []
    for c_round in range(1, rounds + 2):
        began = time.perf_counter()
        selected = clients if c_round == 1 else server.randomSample_clients(clients, 1.0)
        for client in selected:
            client.local_train(args.local_epoch)
        server.aggregate_weights_se(selected)
        for client in selected:
            client.download_from_server(args, server)
        if c_round > 1:                    # round 1 warms caches and allocators up
            times.append(time.perf_counter() - began)
    val = [c.train_stats["valAccs"][-1] for c in clients]
    test = [c.train_stats["testAccs"][-1] for c in clients if c.train_stats.get("testAccs")]
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"s_per_round": sum(times) / len(times), "min_s": min(times),
            "median_s": statistics.median(times), "setup_s": setup,
            "peak_rss_mb": peak_mb, "mean_val_acc": sum(val) / len(val),
            **({"mean_test_acc": sum(test) / len(test)} if test else {}),
            "device": device, "threads": threads}


def ensure_dependencies(authors: Path, python: str) -> None:
    """Install pandas and scikit-learn for their code into ``PATH/.deps`` unless there, or
    unless ``python`` has both already (a GPU machine's image, which has no network for pip)."""
    import subprocess

    deps = authors / ".deps"
    if (deps / "pandas").is_dir() and (deps / "sklearn").is_dir():
        return
    present = subprocess.run([python, "-c", "import pandas, sklearn"], capture_output=True)
    if present.returncode == 0:
        return
    # --no-deps: numpy and scipy are the environment's; pip would add copies otherwise.
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--target", str(deps),
                    *DEPENDENCIES], check=True)
