"""Build a public initial model: an algorithm's model pretrained on public graphs, centrally.

The recipe behind a plan's [model] init_sha256 (docs/configuration.md). Every graph of the
public TU folders given gets one constant node feature, so what is learnt comes from structure
alone (FedStar's structure channel needs no node features: the random-walk and degree
embeddings are its input), and its class is its dataset's label offset by the classes of the
folders before it (one joint task). The model the plan's [model] settings build is trained on a
stratified split of them for a few epochs in one process, then the algorithm's shared groups
(with --all-groups every group) are written as an initial model
(silo/training/initial_model.py) whose header records the datasets (name, graphs, classes and a
SHA-256 of each folder's files), the settings and the versions. The last line printed is the
file's SHA-256: what the plan names. The public data must not include the federation's own
(for NCI1, e.g. the other TU molecule sets with PROTEINS and ENZYMES); --exclude refuses a folder
by name.

    python bench/pretrain_public.py \\
        --data ../shared/data/tu/{MUTAG,PTC_MR,AIDS,BZR,COX2,DHFR,PROTEINS,ENZYMES} \\
        --exclude NCI1 --epochs 30 --hidden 32 --out init-fedstar.pt   # docs/privacy.md's recipe
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def folder_sha256(folder: Path) -> str:
    """SHA-256 over a folder's file names and bytes, in name order (which public data it was)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def public_graphs(folders: list[Path]) -> tuple[Any, list[dict[str, Any]]]:
    """The folders' graphs as one structure-only dataset, and what each folder was."""
    import torch

    from trellis.silo.data.datasets import load_graph_folder
    from trellis.silo.data.tu import GraphDataset

    graphs, sources, offset = [], [], 0
    for folder in folders:
        dataset = load_graph_folder(folder)
        for graph in dataset.graphs:
            graph.x = torch.ones(int(graph.num_nodes), 1)
            graph.y = graph.y + offset
            graphs.append(graph)
        sources.append({"name": dataset.name, "graphs": len(dataset.graphs),
                        "classes": dataset.num_classes, "sha256": folder_sha256(folder)})
        offset += dataset.num_classes
    return GraphDataset("public", graphs, num_classes=offset, num_features=1,
                        feature_kind="constant"), sources


def pretrain(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """Train, write the initial model; its SHA-256 and header."""
    import torch

    from trellis.protos.algorithms import GRAPH_TASK, algorithm
    from trellis.protos.plan import AggregationConfig, ModelConfig, PublicPlan, TrainingConfig
    from trellis.protos.version import package_version
    from trellis.silo.training.initial_model import model_parameters, write_initial_model
    from trellis.silo.training.trainer import LocalTrainer

    row = algorithm(args.algorithm)
    if row.task != GRAPH_TASK:
        raise SystemExit(f"error: {row.name} is not a graph-classification algorithm")
    named = [Path(f).name for f in args.data]
    clash = sorted(set(named) & set(args.exclude))
    if clash:
        raise SystemExit(f"error: {', '.join(clash)} is excluded (--exclude): the public "
                         "starting point must not have seen the federation's own data")
    torch.set_num_threads(args.threads)
    dataset, sources = public_graphs([Path(f) for f in args.data])
    model = ModelConfig(hidden=args.hidden, layers=args.layers, dropout=args.dropout,
                        n_rw=args.n_rw, n_dg=args.n_dg, width=args.width, norm=args.norm)
    plan = PublicPlan(federation="pretrain", algorithm=row.name, rounds=1, seed=args.seed,
                      model=model,
                      training=TrainingConfig(lr=args.lr, batch_size=args.batch_size,
                                              local_epochs=1, split_seed=args.seed),
                      aggregation=AggregationConfig())
    trainer = LocalTrainer(dataset, plan, "public")
    for epoch in range(1, args.epochs + 1):
        loss = trainer.train()["train_loss"]
        acc, _, _ = trainer.evaluate("val")
        print(f"epoch {epoch}: train loss {loss:.4f}, validation accuracy {acc:.3f} "
              f"({dataset.num_classes} joint classes)", flush=True)
    test_acc, _, _ = trainer.evaluate("test")
    groups = None if args.all_groups else set(row.shares)
    parameters = {n: t for n, t in model_parameters(trainer.model).items()
                  if groups is None or n.split(".", 1)[0] in groups}
    settings = asdict(model)
    for plan_only in ("init_sha256", "frozen"):
        settings.pop(plan_only)
    header = {"algorithm": row.name, "model": settings,
              "groups": sorted({n.split(".", 1)[0] for n in parameters}),
              "pretrained_on": sources,
              "task": "structure only: one constant node feature; the datasets' classes "
                      "joined",
              "training": {"epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size,
                           "seed": args.seed, "test_accuracy": round(test_acc, 4)},
              "versions": {"trellis": package_version(), "torch": str(torch.__version__),
                           "python": platform.python_version()}}
    return write_initial_model(Path(args.out), parameters, header), header


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", nargs="+", required=True, help="public TU folders")
    parser.add_argument("--exclude", nargs="*", default=[],
                        help="dataset folder names that must not be among --data (e.g. NCI1)")
    parser.add_argument("--algorithm", default="fedstar")
    parser.add_argument("--out", required=True, help="the initial model file to write")
    parser.add_argument("--all-groups", action="store_true",
                        help="write every group, not only the algorithm's shared ones")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    # The plan's [model] settings: the file fits only a plan with the same ones.
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--n-rw", type=int, default=16)
    parser.add_argument("--n-dg", type=int, default=16)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--norm", default="batch")
    args = parser.parse_args()
    digest, header = pretrain(args)
    print(f"wrote {args.out}: groups {', '.join(header['groups'])}; pretrained on "
          f"{', '.join(s['name'] for s in header['pretrained_on'])}; test accuracy "
          f"{header['training']['test_accuracy']}")
    print(digest)


if __name__ == "__main__":
    main()
