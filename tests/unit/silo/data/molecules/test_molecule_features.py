"""The OGB atom and bond featuriser: widths, OGB's own worked example, the one-hot layout."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("rdkit")

from rdkit import Chem  # noqa: E402

from trellis.silo.data.molecules.features import (  # noqa: E402
    ATOM_COLUMNS,
    ATOM_WIDTH,
    BOND_COLUMNS,
    BOND_WIDTH,
    FEATURISER,
    MoleculeRefused,
    atom_indices,
    bond_indices,
    mol_to_graph,
)


def test_the_widths_are_the_sums_of_ogbs_vocabularies() -> None:
    assert [c.width for c in ATOM_COLUMNS] == [119, 5, 12, 12, 10, 6, 6, 2, 2]
    assert [c.width for c in BOND_COLUMNS] == [5, 6, 2]
    assert (ATOM_WIDTH, BOND_WIDTH) == (174, 13)
    assert (FEATURISER.name, FEATURISER.version) == ("ogb-atom-bond", "1")
    assert FEATURISER.settings == {"standardise": False}


def test_ogbs_worked_example_gives_ogbs_indices() -> None:
    # ogb/utils/features.py's own check: the chiral carbon and the E double bond.
    mol = Chem.MolFromSmiles("Cl[C@H](/C=C/C)Br")
    assert atom_indices(mol.GetAtomWithIdx(1)) == [5, 2, 4, 5, 1, 0, 2, 0, 0]
    assert bond_indices(mol.GetBondWithIdx(2)) == [1, 2, 0]


def test_benzene_ammonium_and_misc() -> None:
    benzene = Chem.MolFromSmiles("c1ccccc1")
    assert atom_indices(benzene.GetAtomWithIdx(0)) == [5, 0, 3, 5, 1, 0, 1, 1, 1]
    assert bond_indices(benzene.GetBondWithIdx(0)) == [3, 0, 1]
    ammonium = Chem.MolFromSmiles("[NH4+]")
    assert atom_indices(ammonium.GetAtomWithIdx(0)) == [6, 0, 4, 6, 4, 0, 2, 0, 0]
    # A charge outside -5..5 takes "misc", the vocabulary's last entry.
    odd = Chem.MolFromSmiles("[C+6]", sanitize=False)
    odd.UpdatePropertyCache(strict=False)
    assert atom_indices(odd.GetAtomWithIdx(0))[3] == 11


def test_mol_to_graph_is_one_hot_with_both_directions_of_each_bond() -> None:
    x, edge_index, edge_attr = mol_to_graph(Chem.MolFromSmiles("CCO"))
    assert x.dtype == np.float32 and x.shape == (3, 174)
    assert (x.sum(axis=1) == len(ATOM_COLUMNS)).all()
    assert edge_index.dtype == np.int64
    assert edge_index.T.tolist() == [[0, 1], [1, 0], [1, 2], [2, 1]]
    assert edge_attr.shape == (4, 13) and (edge_attr.sum(axis=1) == 3).all()
    assert x[2, 7] == 1.0                       # oxygen: atomic number 8 at index 7
    assert x[0, 119 + 5 + 12 + 5] == 1.0        # the formal charge block starts at 136: 0 -> 141


def test_a_molecule_without_bonds_has_empty_edges() -> None:
    x, edge_index, edge_attr = mol_to_graph(Chem.MolFromSmiles("[Na+].[Cl-]"))
    assert x.shape == (2, 174) and edge_index.shape == (2, 0) and edge_attr.shape == (0, 13)


def test_a_molecule_without_atoms_is_refused() -> None:
    with pytest.raises(MoleculeRefused, match="no atoms"):
        mol_to_graph(Chem.Mol())
