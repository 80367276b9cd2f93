"""INTERIM: writes a converted RDF graph as a prepared folder until helper A's
`write_prepared_hetero` (silo/data/prepared/folder.py) replaces `write_rdf_prepared_interim`.

The folder is docs/hetero-format.md's (`meta.json` + `arrays.npz`, written by
`save_hetero_folder`) plus a `manifest.json` in the spirit of docs/data/format.md (format
``trellis-prepared/1``, task ``node``). It is written into a temporary sibling and renamed into
place only when complete, so nothing half-written is ever left.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from trellis.protos.version import package_version
from trellis.silo.data.hetero import save_hetero_folder
from trellis.silo.data.rdf.node_split import DESCRIPTION
from trellis.silo.data.rdf.read import RdfConversion
from trellis.silo.data.tu import DataFormatError

MANIFEST = "manifest.json"
FORMAT = "trellis-prepared/1"


def write_rdf_prepared_interim(done: RdfConversion, out: Path, *, name: str = "",
                               strict: bool = False) -> Path:
    """Write `done` to the new folder `out` (meta.json, arrays.npz, manifest.json)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataFormatError(f"{out}: already exists and is not empty; choose a new folder")
    if strict and done.refused:
        raise DataFormatError(f"{done.sources[0].name}: {len(done.refused)} rows refused and "
                              "strict preparation stops at any refusal; nothing written")
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_hetero_folder(done.graph, temporary, {"dataset": name or done.sources[0].stem,
                                                   "classes": done.classes})
        manifest = _manifest(done, name or done.sources[0].stem)
        (temporary / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if out.exists():
            out.rmdir()
        temporary.rename(out)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return out


def _manifest(done: RdfConversion, name: str) -> dict[str, Any]:
    graph = done.graph
    labelled = graph.labels[graph.labels >= 0]
    counts = np.bincount(labelled, minlength=graph.num_classes)
    edges = {f"{s}|{r}|{d}": int(graph.edges[(s, r, d)].shape[1]) for s, r, d in graph.edge_types}
    return {
        "format": FORMAT, "task": "node", "name": name,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "sources": [_source(p) for p in done.sources],
        "featuriser": {"name": done.featuriser.name, "version": done.featuriser.version,
                       "settings": done.featuriser.settings},
        "fingerprint": "",
        "versions": {"trellis": package_version(), "python": platform.python_version(),
                     "numpy": np.__version__, "rdkit": None, "torch_geometric": None,
                     "rdflib": _rdflib_version()},
        "counts": {"graphs": 1, "targets": int(graph.labels.size),
                   "classes": {c: int(n) for c, n in zip(done.classes, counts, strict=True)},
                   "refused": len(done.refused)},
        "stats": {"nodes": dict(graph.num_nodes), "edges": edges,
                  "node_features": 0, "edge_features": 0},
        "refused": [{"source": r.source, "row": r.row, "reason": r.reason}
                    for r in done.refused],
        "split": {"kind": DESCRIPTION, "train": int(graph.train_idx.size),
                  "val": int(graph.val_idx.size), "test": int(graph.test_idx.size)},
        "notes": done.notes,
    }


def _source(path: Path) -> dict[str, Any]:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return {"name": path.name, "sha256": digest.hexdigest(), "bytes": path.stat().st_size}


def _rdflib_version() -> str | None:
    try:
        import rdflib
    except ImportError:
        return None
    return str(rdflib.__version__)
