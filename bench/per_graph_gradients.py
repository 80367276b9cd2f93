"""Benchmark: seconds per clipped per-graph gradient sum, fast path against microbatch, 1 thread.

One call of ``silo/privacy/per_graph_gradients.py::clipped_gradient_sum`` on 32 NCI1 graphs (a fixed
random draw from the first 512), for FedStar's DualChannelGIN, FedDense's DualDenseGIN with
``norm = "layer"`` and the GIN of FedAvg, at the plan's default sizes, in training mode (dropout
0.5, as DP-SGD would train). Each method is timed ``--repeat`` times after two warm-up calls,
the two methods taking turns (load elsewhere on the machine hits both); the median is kept.
"plain" is the batch's unclipped summed gradient (one forward and backward), for scale.
Also checks, in eval mode, that the two methods give the same sum. Writes
bench/results/per_graph_gradients.json. Needs ../shared/data/tu/NCI1.

    python bench/per_graph_gradients.py [--graphs 32] [--repeat 15]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TU = ROOT.parent / "shared" / "data" / "tu"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from trellis.protos.plan import ModelConfig  # noqa: E402
from trellis.silo.data.structure import add_structure_embeddings  # noqa: E402
from trellis.silo.data.tu import load_tu_folder  # noqa: E402
from trellis.silo.models.batching import PackedGraphs  # noqa: E402
from trellis.silo.models.dense import dense_path  # noqa: E402
from trellis.silo.models.graph_classifiers import GRAPH_MODELS  # noqa: E402
from trellis.silo.privacy.per_graph_gradients import clipped_gradient_sum, graph_nll  # noqa: E402

MODELS = {"fedstar (dual_channel_gin)": "dual_channel_gin",
          "feddense (dual_dense_gin, norm=layer)": "dual_dense_gin",
          "fedavg (gin)": "gin"}
POOL = 512          # graphs packed (structure embeddings for all of NCI1 would take a while)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--clip", type=float, default=1.0)
    args = parser.parse_args()
    if not (TU / "NCI1").exists():
        sys.exit(f"needs the shared datasets at {TU}")
    torch.set_num_threads(1)
    ds = load_tu_folder(TU / "NCI1")
    ds.graphs = ds.graphs[:POOL]
    add_structure_embeddings(ds)
    packed = PackedGraphs(ds.graphs, structure=True, gcn=True)
    ids = torch.randperm(POOL, generator=torch.Generator().manual_seed(0))[:args.graphs]
    nodes = int(packed.select(ids).batch.numel())
    load_before = os.getloadavg()[0]
    rows = {}
    for label, family in MODELS.items():
        torch.manual_seed(0)
        model = GRAPH_MODELS[family].build(ds.num_features, ds.num_classes,
                                           ModelConfig(norm="layer"))
        loss = graph_nll(model)
        model.eval()
        fast = clipped_gradient_sum(model, loss, packed, ids, args.clip)
        reference = clipped_gradient_sum(model, loss, packed, ids, args.clip,
                                         method="microbatch")
        difference = max(float((fast.gradients[n] - reference.gradients[n]).abs().max())
                         for n in fast.gradients)
        largest = max(float(g.abs().max()) for g in reference.gradients.values())
        model.train()
        seconds: dict[str, list[float]] = {"fast": [], "microbatch": [], "plain": []}
        for rep in range(args.repeat + 2):
            for method in seconds:
                began = time.perf_counter()
                if method == "plain":      # the batch's summed gradient, no clipping
                    torch.autograd.grad(loss(packed.select(ids)).sum(),
                                        list(model.parameters()))
                else:
                    result = clipped_gradient_sum(model, loss, packed, ids, args.clip,
                                                  method=method)
                    if result.method != method:
                        sys.exit(f"{label}: {method} fell back: {result.fallback}")
                took = time.perf_counter() - began
                if rep >= 2:
                    seconds[method].append(took)
        fast_s = statistics.median(seconds["fast"])
        micro_s = statistics.median(seconds["microbatch"])
        rows[label] = {"fast_s": round(fast_s, 5), "microbatch_s": round(micro_s, 5),
                       "speedup": round(micro_s / fast_s, 2),
                       "plain_batch_gradient_s": round(statistics.median(seconds["plain"]), 5),
                       "max_abs_difference_eval": difference,
                       "largest_entry": round(largest, 5)}
    figures = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/per_graph_gradients.py", *sys.argv[1:]]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, 1 torch thread",
        "torch": torch.__version__,
        "dense_path": dense_path().reason,
        "load_average_before": round(load_before, 2),
        "load_average_after": round(os.getloadavg()[0], 2),
        "dataset": "NCI1", "graphs": args.graphs, "nodes": nodes, "clip": args.clip,
        "repeat": args.repeat, "statistic": "median seconds per call",
        "models": rows,
    }
    out = ROOT / "bench" / "results" / "per_graph_gradients.json"
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"{args.graphs} NCI1 graphs ({nodes} nodes), 1 thread, median of {args.repeat} "
          f"(load average before {load_before:.1f}, after {figures['load_average_after']:.1f}); "
          f"dense path: {figures['dense_path']}")
    print(f"{'model':<40}{'fast s':>9}{'micro s':>9}{'speedup':>9}{'plain s':>9}  "
          "max |fast - micro| (eval)")
    for label, row in rows.items():
        print(f"{label:<40}{row['fast_s']:>9.4f}{row['microbatch_s']:>9.4f}"
              f"{row['speedup']:>8.1f}x{row['plain_batch_gradient_s']:>9.4f}  "
              f"{row['max_abs_difference_eval']:.1e} "
              f"(largest entry {row['largest_entry']:.2f})")
    print(f"written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
