"""The prepared-dataset folder: manifest.json and graphs.npz, written atomically, read checked.

The format is documented in docs/data/format.md: plain numpy arrays (read with
``allow_pickle=False``, so opening a folder never runs code) and a JSON manifest saying where
the graphs came from, how they were featurised and which input rows were refused. A folder is
either complete or absent: it is written into a hidden sibling and renamed into place last.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trellis.protos.version import package_version
from trellis.silo.data.graph import Graph
from trellis.silo.data.hetero import HeteroGraph, save_hetero_folder
from trellis.silo.data.prepared.arrays import SPLIT_PARTS, check_graph_arrays, pack_graphs
from trellis.silo.data.prepared.model import Featuriser, Preparation, Refusal
from trellis.silo.data.tu import (
    DataFormatError,
    FeatureEncoding,
    GraphDataset,
    featuriser_json,
)

FORMAT = "trellis-prepared/1"
MANIFEST = "manifest.json"
GRAPHS = "graphs.npz"


class RowsRefused(DataFormatError):
    """--strict preparation with refused rows: nothing is written; ``refused`` lists them."""

    def __init__(self, message: str, refused: Sequence[Refusal]) -> None:
        super().__init__(message)
        self.refused = list(refused)


def is_prepared_folder(folder: Path) -> bool:
    """Whether a folder is a prepared dataset (it has a manifest.json)."""
    return (Path(folder) / MANIFEST).is_file()


@contextmanager
def atomic_folder(out: Path) -> Iterator[Path]:
    """A fresh hidden sibling of `out` to write into, renamed to `out` when the block ends well.

    `out` must not exist or be an empty folder. On any error, Ctrl-C or SIGTERM (raised as an
    interrupt by the command line) the sibling is removed and `out` is left as it was.
    """
    out = Path(out)
    refuse_existing(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        os.chmod(work, 0o755)       # mkdtemp makes it private; a silo may run as another user
        yield work
        if out.is_dir():
            out.rmdir()             # the empty folder the operator named
        work.rename(out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def refuse_existing(out: Path) -> None:
    """Refuse an output path that is a file or a folder with something in it."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataFormatError(f"{out}: already exists and is not an empty folder; name a new "
                              "output folder (nothing was written)")


def write_prepared(prep: Preparation, out: Path, *, strict: bool, fingerprint: str = "",
                   now: datetime | None = None) -> Path:
    """Write a preparation as a prepared folder at `out` (all or nothing); return `out`."""
    out = Path(out)
    refuse_existing(out)
    _refuse_rows(prep.refused, strict)
    if not prep.graphs:
        raise DataFormatError(f"{_source_names(prep.sources)}: no graph could be prepared "
                              f"({len(prep.refused)} row(s) refused)")
    with atomic_folder(out) as work:
        arrays: dict[str, Any] = dict(pack_graphs(prep.graphs))
        if prep.split is not None:
            for part in SPLIT_PARTS:
                arrays[f"split_{part}"] = np.asarray(prep.split[part], np.int64)
        manifest = build_manifest(prep, fingerprint=fingerprint, now=now)
        check_graph_arrays(arrays, manifest, out / GRAPHS)    # what a reader will check
        np.savez_compressed(work / GRAPHS, **arrays)
        (work / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return out


def write_prepared_hetero(graph: HeteroGraph, refused: Sequence[Refusal], featuriser: Featuriser,
                          sources: Sequence[Path], out: Path, *, name: str, strict: bool,
                          fingerprint: str = "", notes: Sequence[str] = (),
                          now: datetime | None = None,
                          meta: dict[str, Any] | None = None) -> Path:
    """Write a heterogeneous graph (RDF) as a prepared folder: the hetero folder + manifest
    (`meta`: more keys for the folder's meta.json, e.g. the label values of its classes)."""
    out = Path(out)
    refuse_existing(out)
    _refuse_rows(refused, strict)
    labelled = graph.labels[graph.labels >= 0]
    labels, counts = np.unique(labelled, return_counts=True)
    edges = sum(int(e.shape[1]) for e in graph.edges.values())
    manifest = _manifest_head("node", name, sources, featuriser, fingerprint, now) | {
        "counts": {"graphs": 1, "classes": _class_counts(labels, counts,
                                                         (meta or {}).get("classes")),
                   "refused": len(refused)},
        "stats": {"nodes": _spread(np.array([graph.total_nodes])),
                  "edges": _spread(np.array([edges])), "node_features": 0, "edge_features": 0,
                  "node_types": {t: graph.num_nodes[t] for t in graph.node_types},
                  "edge_types": {" ".join(et): int(graph.edges[et].shape[1])
                                 for et in graph.edge_types}},
        "refused": [_refusal(r) for r in refused],
        "split": {"kind": "given", "train": int(graph.train_idx.size),
                  "val": int(graph.val_idx.size), "test": int(graph.test_idx.size)},
        "notes": list(notes)}
    text = json.dumps(manifest, indent=1) + "\n"
    with atomic_folder(out) as work:
        save_hetero_folder(graph, work, meta)
        (work / MANIFEST).write_text(text, encoding="utf-8")
    return out


def build_manifest(prep: Preparation, *, fingerprint: str = "", now: datetime | None = None
                   ) -> dict[str, Any]:
    """The manifest.json of a graph-classification preparation (docs/data/format.md)."""
    labels, counts = np.unique([g.label for g in prep.graphs], return_counts=True)
    nodes = np.array([g.x.shape[0] for g in prep.graphs])
    edges = np.array([g.edge_index.shape[1] for g in prep.graphs])
    first = prep.graphs[0] if prep.graphs else None
    split = None
    if prep.split is not None:
        split = {"kind": prep.split_kind or "given",
                 **{part: int(np.asarray(prep.split[part]).size) for part in SPLIT_PARTS}}
    return _manifest_head("graph", prep.name, prep.sources, prep.featuriser, fingerprint, now) | {
        "counts": {"graphs": len(prep.graphs), "classes": _class_counts(labels, counts),
                   "refused": len(prep.refused)},
        "stats": {"nodes": _spread(nodes), "edges": _spread(edges),
                  "node_features": int(first.x.shape[1]) if first is not None else 0,
                  "edge_features": (int(first.edge_attr.shape[1])
                                    if first is not None and first.edge_attr is not None
                                    else 0)},
        "refused": [_refusal(r) for r in prep.refused],
        "split": split,
        "notes": list(prep.notes)}


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of a prepared folder, refused when missing, malformed or of another format."""
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataFormatError(f"{path}: missing; is {folder} a prepared folder?") from None
    except (OSError, ValueError) as exc:
        raise DataFormatError(f"{path}: not a readable JSON manifest ({exc})") from None
    if not isinstance(manifest, dict):
        raise DataFormatError(f"{path}: not a manifest (a JSON object is expected)")
    if manifest.get("format") != FORMAT:
        raise DataFormatError(f"{path}: format {manifest.get('format')!r} is not {FORMAT!r}, "
                              "the one this Trellis reads; prepare the data again with "
                              "`silo data prepare`")
    if manifest.get("task") not in ("graph", "node"):
        raise DataFormatError(f"{path}: task must be 'graph' or 'node', got "
                              f"{manifest.get('task')!r}")
    return manifest


def read_prepared_arrays(folder: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The manifest and checked arrays of a prepared graph-classification folder."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest["task"] != "graph":
        raise DataFormatError(f"{folder / MANIFEST}: a heterogeneous graph (task "
                              f"{manifest['task']!r}), not a set of graphs to classify")
    path = folder / GRAPHS
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except FileNotFoundError:
        raise DataFormatError(f"{path}: missing") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        # ValueError: an array of pickled objects, which is never loaded
        raise DataFormatError(f"{path}: cannot be read ({exc})") from None
    check_graph_arrays(arrays, manifest, path)
    return manifest, arrays


def load_prepared(folder: Path) -> GraphDataset:
    """A prepared folder as the GraphDataset training reads (classes: its sorted raw labels)."""
    manifest, arrays = read_prepared_arrays(folder)
    x, edge_index, edge_attr = arrays["x"], arrays["edge_index"], arrays.get("edge_attr")
    node_ptr, edge_ptr = arrays["node_ptr"], arrays["edge_ptr"]
    classes, y = np.unique(arrays["y"], return_inverse=True)
    graphs = []
    for g in range(y.size):
        n0, n1, e0, e1 = (int(v) for v in (node_ptr[g], node_ptr[g + 1], edge_ptr[g],
                                           edge_ptr[g + 1]))
        graphs.append(Graph(
            x=torch.from_numpy(x[n0:n1].copy()),
            edge_index=torch.from_numpy(edge_index[:, e0:e1] - n0),
            y=torch.tensor([int(y[g])], dtype=torch.long), num_nodes=n1 - n0,
            edge_attr=None if edge_attr is None else torch.from_numpy(edge_attr[e0:e1].copy())))
    split = None
    if manifest["split"] is not None:
        split = {part: arrays[f"split_{part}"] for part in SPLIT_PARTS}
    width = int(x.shape[1])
    return GraphDataset(
        name=str(manifest.get("name") or Path(folder).name), graphs=graphs,
        num_classes=int(classes.size), num_features=width,
        feature_kind=str(manifest["featuriser"]["name"]),
        encoding=FeatureEncoding("prepared", width, tuple(int(c) for c in classes),
                                 featuriser=featuriser_json(manifest["featuriser"])),
        split=split)


def _refuse_rows(refused: Sequence[Refusal], strict: bool) -> None:
    if strict and refused:
        first = refused[0]
        raise RowsRefused(f"{first.source}: row {first.row}: {first.reason} ({len(refused)} "
                          "row(s) refused and --strict is set: nothing written)", refused)


def _manifest_head(task: str, name: str, sources: Sequence[Path], featuriser: Featuriser,
                   fingerprint: str, now: datetime | None) -> dict[str, Any]:
    when = (now or datetime.now(UTC)).astimezone(UTC)
    return {"format": FORMAT, "task": task, "name": name,
            "created_at": when.isoformat(timespec="seconds").replace("+00:00", "Z"),
            "sources": [entry for path in sources for entry in _source_entries(Path(path))],
            "featuriser": {"name": featuriser.name, "version": featuriser.version,
                           "settings": featuriser.settings},
            "fingerprint": fingerprint,
            "versions": {"trellis": package_version(), "python": platform.python_version(),
                         "numpy": np.__version__, "rdkit": _installed("rdkit"),
                         "torch_geometric": _installed("torch_geometric")}}


def _source_entries(path: Path) -> list[dict[str, Any]]:
    """{name, sha256, bytes} of a source file, or of every file under a source folder."""
    if path.is_dir():
        return [{"name": f.relative_to(path.parent).as_posix(), "sha256": _sha256(f),
                 "bytes": f.stat().st_size} for f in sorted(path.rglob("*")) if f.is_file()]
    return [{"name": path.name, "sha256": _sha256(path), "bytes": path.stat().st_size}]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _installed(package: str) -> str | None:
    """An installed package's version, read from its metadata (the package is not imported)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _class_counts(labels: np.ndarray, counts: np.ndarray,
                  names: Sequence[str] | None = None) -> dict[str, int]:
    """Counts per class, named by the class's label value when the source gave them."""
    return {str(names[int(label)]) if names else str(int(label)): int(n)
            for label, n in zip(labels, counts, strict=True)}


def _spread(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"min": 0, "mean": 0.0, "max": 0}
    return {"min": int(values.min()), "mean": round(float(values.mean()), 3),
            "max": int(values.max())}


def _refusal(refusal: Refusal) -> dict[str, str]:
    return {"source": refusal.source, "row": refusal.row, "reason": refusal.reason}


def _source_names(sources: Sequence[Path]) -> str:
    return ", ".join(Path(p).name for p in sources) or "the source"
