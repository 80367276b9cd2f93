"""The reference-set fingerprint: a hash that proves two sites prepare molecules identically.

Every site prepares the same public molecules (reference.smi, shipped with Trellis) with its
featuriser and settings, and hashes the resulting arrays in one fixed byte order; equal hashes
mean equal preparation (the MELLODDY consortium's check). A plan names the hash it requires
(``[data] reference_sha256``); a silo whose dataset's manifest records another refuses the plan
before anything is sent (dataset_check.py).

What is hashed, each item as an 8-byte little-endian length and then its bytes: the format tag
below, the featuriser's name, version and settings (JSON, sorted keys, no spaces), then for x
(float32), edge_index (int64, node numbers within each molecule), edge_attr (float32), node_ptr
and edge_ptr (int64, the running totals that cut the concatenated arrays into molecules, G + 1
entries): the name, the dtype ("<f4" or "<i8"), the shape (JSON) and the little-endian C-order
bytes. Importing this module does not load RDKit: only computing a fingerprint does.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from trellis.silo.data.molecules.features import (
    FEATURISER_NAME,
    MoleculeRefused,
    featuriser_for,
    prepared_graph,
)
from trellis.silo.data.molecules.rdkit_support import rdkit_chem, rdkit_messages, rdkit_reason
from trellis.silo.data.prepared.model import Featuriser, PreparedGraph, SourceOptions

REFERENCE = Path(__file__).with_name("reference.smi")
FORMAT_TAG = "trellis-reference-fingerprint/1"


def reference_molecules() -> list[tuple[int, str, str]]:
    """(line, SMILES, name) of every molecule of the reference set."""
    found = []
    for line_no, line in enumerate(REFERENCE.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip() and not line.startswith("#"):
            smiles, name = line.split("\t", 1)
            found.append((line_no, smiles, name))
    return found


def options_for(featuriser: Featuriser) -> SourceOptions:
    """The source options that reproduce `featuriser`; ValueError for one this Trellis cannot."""
    options = SourceOptions(standardise=bool(featuriser.settings.get("standardise", False)))
    if featuriser_for(options) != featuriser:
        raise ValueError(f"this Trellis cannot prepare molecules as {featuriser.name} version "
                         f"{featuriser.version} with settings {featuriser.settings}: it has "
                         f"{featuriser_for(options).name} version "
                         f"{featuriser_for(options).version}")
    return options


def reference_graphs(featuriser: Featuriser) -> list[PreparedGraph]:
    """The reference set prepared exactly as a molecule source would under `featuriser`."""
    options = options_for(featuriser)
    chem = rdkit_chem(REFERENCE.name)
    graphs = []
    with rdkit_messages() as log:
        for line, smiles, name in reference_molecules():
            log.clear()
            mol = chem.MolFromSmiles(smiles)
            try:
                if mol is None:
                    raise MoleculeRefused(rdkit_reason(log, "RDKit cannot read it"))
                graphs.append(prepared_graph(mol, label=0, origin=f"{REFERENCE.name}:{line}",
                                             options=options))
            except MoleculeRefused as exc:
                # The set is ours: a molecule it refuses is a bug here, not a site's mistake.
                raise ValueError(f"{REFERENCE.name}: line {line} ({name}): {exc}") from None
    return graphs


def reference_fingerprint(featuriser: Featuriser) -> str:
    """SHA-256 (hex) of the reference set prepared under `featuriser` (module docstring)."""
    graphs = reference_graphs(featuriser)
    digest = hashlib.sha256()
    _add(digest, FORMAT_TAG.encode())
    _add(digest, featuriser.name.encode())
    _add(digest, featuriser.version.encode())
    _add(digest, json.dumps(featuriser.settings, sort_keys=True, separators=(",", ":")).encode())
    nodes = np.cumsum([0] + [g.x.shape[0] for g in graphs])
    edges = np.cumsum([0] + [g.edge_index.shape[1] for g in graphs])
    width = graphs[0].edge_attr.shape[1] if graphs[0].edge_attr is not None else 0
    arrays: list[tuple[str, Any, str]] = [
        ("x", np.concatenate([g.x for g in graphs]), "<f4"),
        ("edge_index", np.concatenate([g.edge_index for g in graphs], axis=1), "<i8"),
        ("edge_attr", np.concatenate([g.edge_attr if g.edge_attr is not None
                                      else np.zeros((0, width)) for g in graphs]), "<f4"),
        ("node_ptr", nodes, "<i8"),
        ("edge_ptr", edges, "<i8"),
    ]
    for name, array, dtype in arrays:
        fixed = np.ascontiguousarray(array, dtype=np.dtype(dtype))
        _add(digest, name.encode())
        _add(digest, dtype.encode())
        _add(digest, json.dumps(list(fixed.shape)).encode())
        _add(digest, fixed.tobytes(order="C"))
    return digest.hexdigest()


def fingerprint_for(featuriser: Featuriser) -> str:
    """What a prepared manifest records as `fingerprint`: the reference-set hash for a molecule
    featuriser, "" for any other (the reference set is molecules)."""
    if featuriser.name != FEATURISER_NAME:
        return ""
    return reference_fingerprint(featuriser)


def _add(digest: Any, item: bytes) -> None:
    digest.update(len(item).to_bytes(8, "little"))
    digest.update(item)
