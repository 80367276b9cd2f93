"""Round trip: the TU molecule sets (MUTAG, PTC_MR, AIDS) written out as SMILES and as SDF
(tests/support/tu_molecules.py) and prepared again give the same graphs: atom and bond counts,
labels, elements, and the same typed bonds under the node order. Skipped without the TU data.

What does not round-trip is listed: 2 of MUTAG's 188 graphs and 9 of AIDS's 2000 RDKit cannot
read at all (an atom over its permitted valence), and some graphs have a ring the TU set types
single/double that RDKit calls aromatic (the same bonds, another bond-type label): 7 of PTC_MR's
344, and 965 of AIDS's 1991, whose molecules the TU set holds in Kekulé form throughout.
The other CHEM sets (BZR, COX2, DHFR, NCI1) have no atom-type map and no bond types in their TU
folders, so they cannot be written as molecules.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rdkit")

from rdkit import Chem  # noqa: E402

from tests.paths import TU_ROOT  # noqa: E402
from tests.support.tu_molecules import BOND_NAMES, Written, write_molecules  # noqa: E402
from trellis.silo.data.molecules import sdf, smiles  # noqa: E402
from trellis.silo.data.prepared.model import PreparedGraph, SourceOptions  # noqa: E402

# TU graphs RDKit cannot read as molecules at all, and why (the round trip lists, not hides):
# two MUTAG graphs have a carbon with five bonds.
UNWRITABLE = {"MUTAG": {82, 187}, "PTC_MR": set(),
              # a chlorine, boron or germanium over its valence, or a SMILES RDKit cannot read
              "AIDS": {329, 445, 771, 855, 865, 1106, 1195, 1613, 1655}}
# Graphs with a ring the TU set (CDK's aromaticity model) types single/double and RDKit's model
# calls aromatic: the same bonds, a different bond type label (29 single and 5 double bonds).
AROMATIC_ELSEWHERE: dict[str, set[int] | int] = {
    "MUTAG": set(), "PTC_MR": {13, 43, 61, 90, 96, 172, 221},
    "AIDS": 965,     # too many to list: every Kekulé benzene ring; pinned by count
}


def _bonds(graph: PreparedGraph, order: list[int]) -> set[tuple[int, int, str]]:
    """The graph's bonds as (TU node, TU node, type), each once."""
    assert graph.edge_attr is not None
    kinds = graph.edge_attr[:, :len(BOND_NAMES)].argmax(axis=1)
    found = set()
    for (a, b), kind in zip(graph.edge_index.T.tolist(), kinds.tolist(), strict=True):
        i, j = order[a], order[b]
        found.add((min(i, j), max(i, j), BOND_NAMES[kind]))
    return found


def _check(written: Written, graphs: list[PreparedGraph], orders: list[list[int]]) -> set[int]:
    """Assert every graph is the TU graph; the graphs whose only difference is a ring RDKit
    calls aromatic."""
    table = Chem.GetPeriodicTable()
    aromatic_here: set[int] = set()
    assert len(graphs) == len(written.molecules)
    for graph, molecule, order in zip(graphs, written.molecules, orders, strict=True):
        assert graph.label == molecule.label
        assert graph.x.shape[0] == len(molecule.atoms)
        assert graph.edge_index.shape[1] == 2 * len(molecule.bonds)
        elements = [table.GetElementSymbol(int(k) + 1) for k in graph.x[:, :118].argmax(axis=1)]
        assert [molecule.atoms[order[k]] for k in range(len(order))] == elements
        got = _bonds(graph, order)
        if got == set(molecule.bonds):
            continue
        wanted = {(i, j): kind for i, j, kind in molecule.bonds}
        assert {(i, j) for i, j, _ in got} == set(wanted), f"graph {molecule.index}"
        for i, j, kind in got:
            assert kind == wanted[i, j] or (kind, wanted[i, j]) in (
                ("aromatic", "single"), ("aromatic", "double")), f"graph {molecule.index}"
        aromatic_here.add(molecule.index)
    return aromatic_here


def _expected_aromatic(name: str, found: set[int]) -> bool:
    wanted = AROMATIC_ELSEWHERE[name]
    return len(found) == wanted if isinstance(wanted, int) else found == wanted


@pytest.mark.parametrize("name", ["MUTAG", "PTC_MR", "AIDS"])
def test_tu_molecules_round_trip_through_smiles_and_sdf(tmp_path: Path, name: str) -> None:
    folder = TU_ROOT / name
    if not folder.is_dir():
        pytest.skip(f"{folder} is not here")
    written = write_molecules(folder, tmp_path)
    assert {index for index, _ in written.unwritable} == UNWRITABLE[name], written.unwritable
    from_smiles = smiles.read(written.smiles_csv, SourceOptions(id_column="id"))
    assert from_smiles.refused == []
    aromatic = _check(written, from_smiles.graphs, written.orders)
    assert _expected_aromatic(name, aromatic), sorted(aromatic)
    from_sdf = sdf.read(written.sdf, SourceOptions(label_property="label"))
    assert from_sdf.refused == []
    in_order = [list(range(len(m.atoms))) for m in written.molecules]
    assert _check(written, from_sdf.graphs, in_order) == aromatic
    assert np.array_equal(np.concatenate([g.x for g in from_sdf.graphs]).sum(0),
                          np.concatenate([g.x for g in from_smiles.graphs]).sum(0))
