"""The OGB atom and bond featuriser (ogb.utils.features, as `smiles2graph` uses it), one-hot.

Each atom gets nine categorical columns and each bond three, with OGB's vocabularies: a value
outside a vocabulary takes its last entry ("misc"), as OGB's ``safe_index`` does. OGB's own code
looks chirality up the same way but the bond stereo without a fallback, and raises on RDKit's
newer tags (CHI_TETRAHEDRAL, CHI_ALLENE, ..., STEREOATROPCW, STEREOATROPCCW); here they take
the last entry too (``misc`` for chirality, ``STEREOANY`` for stereo), so no molecule stops a
preparation. Our models take float features: the columns' one-hot vectors side by side, 174
wide for atoms and 13 for bonds (docs/data/molecules.md has the table). Changing a vocabulary,
a column or its order changes the features of the same input: bump FEATURISER_VERSION.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trellis.silo.data.prepared.model import (
    Featuriser,
    Preparation,
    PreparedGraph,
    Refusal,
    SourceOptions,
)

FEATURISER_NAME = "ogb-atom-bond"
FEATURISER_VERSION = "1"
MISC = "misc"


class MoleculeRefused(ValueError):
    """A molecule that parsed but cannot become a graph (no atoms, say)."""


@dataclass(frozen=True)
class Column:
    """One categorical feature: its name, its vocabulary and how it is read off RDKit."""

    name: str
    values: tuple[Any, ...]
    read: Callable[[Any], Any]

    @property
    def width(self) -> int:
        """Its one-hot width: the vocabulary's size."""
        return len(self.values)

    def index(self, item: Any) -> int:
        """The value's index in the vocabulary; the last (``misc``) when it is not in it."""
        value = self.read(item)
        for i, known in enumerate(self.values):
            # `is`-free equality on the same type: True must not match 1, nor False 0.
            if type(known) is type(value) and known == value:
                return i
        return len(self.values) - 1


ATOM_COLUMNS: tuple[Column, ...] = (
    Column("atomic number", (*range(1, 119), MISC), lambda a: a.GetAtomicNum()),
    Column("chirality tag", ("CHI_UNSPECIFIED", "CHI_TETRAHEDRAL_CW", "CHI_TETRAHEDRAL_CCW",
                             "CHI_OTHER", MISC), lambda a: str(a.GetChiralTag())),
    Column("degree (with Hs)", (*range(11), MISC), lambda a: a.GetTotalDegree()),
    Column("formal charge", (*range(-5, 6), MISC), lambda a: a.GetFormalCharge()),
    Column("number of Hs", (*range(9), MISC), lambda a: a.GetTotalNumHs()),
    Column("radical electrons", (*range(5), MISC), lambda a: a.GetNumRadicalElectrons()),
    Column("hybridisation", ("SP", "SP2", "SP3", "SP3D", "SP3D2", MISC),
           lambda a: str(a.GetHybridization())),
    Column("aromatic", (False, True), lambda a: bool(a.GetIsAromatic())),
    Column("in ring", (False, True), lambda a: bool(a.IsInRing())),
)
BOND_COLUMNS: tuple[Column, ...] = (
    Column("bond type", ("SINGLE", "DOUBLE", "TRIPLE", "AROMATIC", MISC),
           lambda b: str(b.GetBondType())),
    Column("stereo", ("STEREONONE", "STEREOZ", "STEREOE", "STEREOCIS", "STEREOTRANS",
                      "STEREOANY"), lambda b: str(b.GetStereo())),
    Column("conjugated", (False, True), lambda b: bool(b.GetIsConjugated())),
)
ATOM_WIDTH = sum(c.width for c in ATOM_COLUMNS)      # 174
BOND_WIDTH = sum(c.width for c in BOND_COLUMNS)      # 13


def featuriser(*, standardise: bool = False) -> Featuriser:
    """The featuriser with the settings that change features (standardising names the
    standardiser's own version: a change of its steps changes the fingerprint)."""
    settings: dict[str, Any] = {"standardise": bool(standardise)}
    if standardise:
        from trellis.silo.data.molecules.standardise import STANDARDISER

        settings["standardiser"] = STANDARDISER
    return Featuriser(FEATURISER_NAME, FEATURISER_VERSION, settings)


FEATURISER = featuriser()


def featuriser_for(options: SourceOptions) -> Featuriser:
    """The featuriser a molecule source uses under `options`."""
    return featuriser(standardise=options.standardise)


def atom_indices(atom: Any) -> list[int]:
    """An RDKit atom's nine categorical indices (OGB's ``atom_to_feature_vector``)."""
    return [column.index(atom) for column in ATOM_COLUMNS]


def bond_indices(bond: Any) -> list[int]:
    """An RDKit bond's three categorical indices (OGB's ``bond_to_feature_vector``)."""
    return [column.index(bond) for column in BOND_COLUMNS]


def one_hot(rows: list[list[int]], columns: tuple[Column, ...]) -> np.ndarray:
    """Categorical index rows -> float32 one-hot, each column's block after the one before."""
    offsets = np.cumsum([0] + [c.width for c in columns[:-1]])
    out = np.zeros((len(rows), sum(c.width for c in columns)), dtype=np.float32)
    if rows:
        hot = np.asarray(rows, dtype=np.int64) + offsets
        out[np.arange(len(rows))[:, None], hot] = 1.0
    return out


def mol_to_graph(mol: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An RDKit molecule -> (x float32 [n, 174], edge_index int64 [2, 2b], edge_attr float32
    [2b, 13]): atoms in RDKit's order, each bond as (i, j) then (j, i), as smiles2graph does."""
    if mol.GetNumAtoms() == 0:
        raise MoleculeRefused("the molecule has no atoms")
    x = one_hot([atom_indices(atom) for atom in mol.GetAtoms()], ATOM_COLUMNS)
    pairs: list[tuple[int, int]] = []
    bond_rows: list[list[int]] = []
    for bond in mol.GetBonds():
        i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        row = bond_indices(bond)
        pairs += [(i, j), (j, i)]
        bond_rows += [row, row]
    edge_index = (np.asarray(pairs, dtype=np.int64).T if pairs
                  else np.zeros((2, 0), dtype=np.int64))
    return x, edge_index, one_hot(bond_rows, BOND_COLUMNS)


def prepared_graph(mol: Any, *, label: int, origin: str,
                   options: SourceOptions) -> PreparedGraph:
    """One parsed molecule -> a PreparedGraph keyed by its canonical SMILES.

    Both molecule sources (SMILES and SDF) and the reference set go through here, so whatever
    `options` change about a molecule (standardisation) changes all three alike.
    """
    from rdkit import Chem

    if options.standardise:
        from trellis.silo.data.molecules.standardise import standardise

        mol, notes = standardise(mol)
        if mol is None:
            raise MoleculeRefused(notes[0] if notes else "standardisation left nothing")
    x, edge_index, edge_attr = mol_to_graph(mol)
    return PreparedGraph(x=x, edge_index=edge_index, edge_attr=edge_attr, label=label,
                         origin=origin, key=Chem.MolToSmiles(mol))


def molecule_preparation(graphs: list[PreparedGraph], refused: list[Refusal],
                         options: SourceOptions, sources: list[Path], name: str) -> Preparation:
    """A molecule source's Preparation, with the scaffold split when asked for (made on the
    canonical SMILES of the molecules kept, after standardisation)."""
    prep = Preparation(graphs=graphs, refused=refused, featuriser=featuriser_for(options),
                       sources=sources, name=name)
    if options.scaffold_split and graphs:
        from trellis.silo.data.molecules.scaffold import scaffold_split

        prep.split = scaffold_split([graph.key for graph in graphs])
        prep.split_kind = "scaffold"
        sizes = {part: int(len(indices)) for part, indices in prep.split.items()}
        prep.notes.append(f"Bemis-Murcko scaffold split: {sizes['train']} train, "
                          f"{sizes['val']} val, {sizes['test']} test")
    return prep
