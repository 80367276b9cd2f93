"""Bemis-Murcko scaffold split of molecules into train/val/test, as MoleculeNet and OGB make it
(docs/data/splits.md).

A random split puts near-copies of a test molecule (same ring system, another side chain) in
training and overstates how well a model generalises to new chemistry; a scaffold split keeps
every ring system in one part. The algorithm is DeepChem's ``ScaffoldSplitter``, which OGB's
molecule splits were made with: group molecules by the SMILES of their Murcko scaffold (no
chirality), take the groups largest first (among groups of one size, the one whose first
molecule comes later goes first: DeepChem sorts (size, first index) in reverse), and put each
whole group in training while training stays within its share, else in validation while
training and validation stay within theirs, else in test. No randomness: the same molecules in
the same order always give the same split.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from rdkit.Chem import Mol

PARTS = ("train", "val", "test")


def murcko_scaffold(mol: Mol) -> str:
    """The canonical SMILES of the molecule's Bemis-Murcko scaffold ("" for an acyclic one)."""
    from rdkit.Chem.Scaffolds import MurckoScaffold

    return str(MurckoScaffold.MurckoScaffoldSmiles(mol=mol, includeChirality=False))


def scaffold_groups(molecules: Sequence[str | Mol]) -> list[list[int]]:
    """Indices of the molecules sharing each scaffold, in the order the split takes them."""
    groups: dict[str, list[int]] = {}
    for index, molecule in enumerate(molecules):
        groups.setdefault(murcko_scaffold(_as_mol(molecule, index)), []).append(index)
    # Indices are appended in order, so each group is sorted and starts with its first index.
    return sorted(groups.values(), key=lambda group: (len(group), group[0]), reverse=True)


def scaffold_split(smiles_or_mols: Sequence[str | Mol],
                   fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
                   ) -> dict[str, np.ndarray]:
    """{"train", "val", "test"} -> sorted int64 indices: a deterministic scaffold split in
    which no scaffold is in two parts."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions must be three non-negative shares that sum to 1; got "
                         f"{tuple(fractions)}")
    total = len(smiles_or_mols)
    train_cutoff = fractions[0] * total
    val_cutoff = (fractions[0] + fractions[1]) * total
    train: list[int] = []
    val: list[int] = []
    test: list[int] = []
    for group in scaffold_groups(smiles_or_mols):
        if len(train) + len(group) <= train_cutoff:
            train.extend(group)
        elif len(train) + len(val) + len(group) <= val_cutoff:
            val.extend(group)
        else:
            test.extend(group)
    return {name: np.sort(np.asarray(part, dtype=np.int64))
            for name, part in zip(PARTS, (train, val, test), strict=True)}


def _as_mol(molecule: str | Mol, index: int) -> Mol:
    if not isinstance(molecule, str):
        return molecule
    from rdkit import Chem

    mol = Chem.MolFromSmiles(molecule)
    if mol is None:
        raise ValueError(f"molecule {index + 1}: invalid SMILES {molecule!r}")
    return mol
