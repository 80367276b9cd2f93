"""TU molecule sets (MUTAG, PTC_MR, AIDS) written out as a SMILES table and as an SD file, for
the round-trip test of the molecule sources and the prepared-vs-TU benchmark.

Atom and bond types come from the set's label maps: the "Node labels" and "Edge labels" tables of
its README.txt(.gz) (MUTAG: 0 C, 1 N, ...; edges 0 aromatic, 1 single, ...), or, for AIDS, the
"converted to integer values using this map" tables of NAME_label_readme.txt(.gz) (edges are
valences 1, 2, 3). AIDS also gives each atom's formal charge (the "charge" column its readme
names among the node attributes); MUTAG and PTC_MR have none. TU graphs have no hydrogens, so a
molecule is written as the graph says and, where RDKit cannot read that back, mended the way a
chemist would without changing its graph: a nitro group's N(=O)O drawn without charges gets them
([N+](=O)[O-]), an aromatic nitrogen that needs one gets its hydrogen ([nH]). What still cannot
be read is listed with RDKit's reason, not written.
"""

from __future__ import annotations

import gzip
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trellis.silo.data.tu import find_tu_prefix, read_tu_node_table, read_tu_structure

BOND_NAMES = ("single", "double", "triple", "aromatic")   # our order: OGB's bond type index
_ENTRY = re.compile(r"^\s+(\d+)\s+(\S+)\s*$")


@dataclass
class TuMolecule:
    """One TU graph as a molecule: element symbols, bonds (i < j, type name), its label."""

    index: int
    atoms: list[str]
    bonds: list[tuple[int, int, str]]
    label: int
    charges: list[int] = field(default_factory=list)   # formal charge per atom, where known


@dataclass
class Written:
    """What `write_molecules` wrote and what it could not."""

    smiles_csv: Path
    sdf: Path
    molecules: list[TuMolecule]                 # those written, in file order
    orders: list[list[int]]                     # SMILES atom k is TU node orders[i][k]
    unwritable: list[tuple[int, str]] = field(default_factory=list)   # (graph index, why)
    mended: int = 0                             # molecules given charges or [nH]


_VALENCE_BONDS = {"1": "single", "2": "double", "3": "triple"}


def _readme_text(folder: Path) -> tuple[str, bool]:
    """(the label maps' text, whether it is the NAME_label_readme form) of a TU molecule set."""
    prefix = find_tu_prefix(folder)
    for name, converted in (("README.txt", False), (f"{prefix}_label_readme.txt", True)):
        for path in (folder / f"{name}.gz", folder / name):
            if path.is_file():
                raw = path.read_bytes()
                text = gzip.decompress(raw) if path.suffix == ".gz" else raw
                if converted or b"Node labels:" in text:
                    return text.decode("utf-8", "replace"), converted
    raise FileNotFoundError(f"{folder}: no README with label maps")


def _table(text: str, title: str) -> dict[int, str]:
    """The `number  name` rows of the first table after `title`."""
    entries: dict[int, str] = {}
    for line in text.split(title, 1)[1].splitlines()[1:]:
        match = _ENTRY.match(line)
        if match:
            entries[int(match[1])] = match[2]
        elif entries and line.strip():
            break
    return entries


def label_maps(folder: Path) -> tuple[dict[int, str], dict[int, str]]:
    """(node label -> element, edge label -> bond name) from the set's README or label readme."""
    return _maps(*_readme_text(folder))


def _maps(text: str, converted: bool) -> tuple[dict[int, str], dict[int, str]]:
    if converted:
        valences = _table(text, "Edge labels were converted")
        return (_table(text, "Node labels were converted"),
                {k: _VALENCE_BONDS[v] for k, v in valences.items()})
    bonds = _table(text, "Edge labels:")
    return _table(text, "Node labels:"), {k: v.lower() for k, v in bonds.items()}


def _charge_column(text: str, converted: bool) -> int | None:
    """Which node-attribute column is the formal charge, if the label readme names one."""
    match = re.search(r"Node attributes:\s*\[([^\]]*)\]", text) if converted else None
    names = [n.strip() for n in match[1].split(",")] if match else []
    return names.index("charge") if "charge" in names else None


def read_tu_molecules(folder: Path) -> list[TuMolecule]:
    """Every graph of a TU molecule set as atoms and typed bonds."""
    readme = _readme_text(folder)        # read once: the maps and the charge column
    nodes, edges = _maps(*readme)
    structure = read_tu_structure(folder)
    node_labels = read_tu_node_table(folder, structure, "node_labels")
    assert node_labels is not None
    node_labels = node_labels.reshape(len(node_labels), -1)[:, 0]
    prefix = find_tu_prefix(folder)
    edge_file = folder / f"{prefix}_edge_labels.txt.gz"
    edge_labels = np.loadtxt(io.BytesIO(gzip.decompress(edge_file.read_bytes())), dtype=np.int64,
                             ndmin=1)
    graph_of_node = structure.graph_of_node
    first = np.searchsorted(graph_of_node, np.arange(structure.graph_labels.size))
    molecules = [TuMolecule(g, [], [], int(label))
                 for g, label in enumerate(structure.graph_labels)]
    for node, graph in enumerate(graph_of_node):
        molecules[graph].atoms.append(nodes[int(node_labels[node])])
    column = _charge_column(*readme)
    if column is not None:
        attributes = read_tu_node_table(folder, structure, "node_attributes")
        assert attributes is not None
        for node, graph in enumerate(graph_of_node):
            molecules[graph].charges.append(int(round(float(attributes[node, column]))))
    for (a, b), kind in zip(structure.edges, edge_labels, strict=True):
        if a < b:
            graph = int(graph_of_node[a])
            offset = int(first[graph])
            molecules[graph].bonds.append((int(a) - offset, int(b) - offset,
                                           edges[int(kind)]))
    return molecules


def to_rdkit(molecule: TuMolecule, *, mend: bool) -> Any:
    """The molecule as an RDKit Mol (not sanitised), mended (module docstring) if asked."""
    from rdkit import Chem

    kinds = {"single": Chem.BondType.SINGLE, "double": Chem.BondType.DOUBLE,
             "triple": Chem.BondType.TRIPLE, "aromatic": Chem.BondType.AROMATIC}
    mol = Chem.RWMol()
    for k, symbol in enumerate(molecule.atoms):
        atom = Chem.Atom(symbol)
        if molecule.charges:
            atom.SetFormalCharge(molecule.charges[k])
        mol.AddAtom(atom)
    for i, j, kind in molecule.bonds:
        mol.AddBond(i, j, kinds[kind])
        if kind == "aromatic":
            mol.GetBondBetweenAtoms(i, j).SetIsAromatic(True)
            mol.GetAtomWithIdx(i).SetIsAromatic(True)
            mol.GetAtomWithIdx(j).SetIsAromatic(True)
    if mend:
        _mend(mol)
    mol.UpdatePropertyCache(strict=False)
    return mol.GetMol()


def _mend(mol: Any) -> None:
    from rdkit import Chem

    for atom in mol.GetAtoms():
        if atom.GetSymbol() != "N":
            continue
        orders = [b.GetBondTypeAsDouble() for b in atom.GetBonds()]
        if sum(orders) == 4 and not atom.GetIsAromatic():
            # A nitro group (or an N-oxide) drawn without charges: N(=O)O -> [N+](=O)[O-].
            atom.SetFormalCharge(1)
            for bond in atom.GetBonds():
                other = bond.GetOtherAtom(atom)
                if (bond.GetBondType() == Chem.BondType.SINGLE and other.GetSymbol() == "O"
                        and other.GetDegree() == 1):
                    other.SetFormalCharge(-1)
                    break
        elif atom.GetIsAromatic() and atom.GetDegree() == 2 and orders == [1.5, 1.5]:
            atom.SetNumExplicitHs(0)


def smiles_of(mol: Any) -> tuple[str, list[int]] | None:
    """(SMILES, TU node of each SMILES atom) if RDKit reads the SMILES back, else None."""
    from rdkit import Chem

    text = Chem.MolToSmiles(mol, canonical=False)
    order = [int(i) for i in mol.GetProp("_smilesAtomOutputOrder").strip("[],").split(",")]
    return (text, order) if Chem.MolFromSmiles(text) is not None else None


def _with_pyrrole_hydrogens(mol: Any) -> Any | None:
    """Try giving aromatic nitrogens one hydrogen each, one at a time: the first that reads."""
    from rdkit import Chem

    candidates = [a.GetIdx() for a in mol.GetAtoms()
                  if a.GetSymbol() == "N" and a.GetIsAromatic() and a.GetDegree() == 2]
    for idx in candidates:
        trial = Chem.RWMol(mol)
        trial.GetAtomWithIdx(idx).SetNumExplicitHs(1)
        trial.GetAtomWithIdx(idx).SetNoImplicit(True)
        trial.UpdatePropertyCache(strict=False)
        if smiles_of(trial) is not None:
            return trial.GetMol()
    return None


def write_molecules(folder: Path, out: Path) -> Written:
    """Write a TU molecule set as out/NAME.csv (smiles,label,id; SMILES atom order in
    `orders`) and out/NAME.sdf (atoms in TU node order, Kekulé bonds, the label in the property
    "label", the record's name "g<index>")."""
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")
    try:
        molecules = read_tu_molecules(folder)
        name = find_tu_prefix(folder)
        csv_path, sdf_path = out / f"{name}.csv", out / f"{name}.sdf"
        written = Written(csv_path, sdf_path, [], [])
        rows = ["smiles,label,id"]
        sdf = io.StringIO()
        for molecule in molecules:
            mol = to_rdkit(molecule, mend=False)
            found = smiles_of(mol)
            if found is None:
                mol = to_rdkit(molecule, mend=True)
                found = smiles_of(mol)
                if found is None:
                    mol = _with_pyrrole_hydrogens(mol)
                    found = smiles_of(mol) if mol is not None else None
                if found is None:
                    why = _why(to_rdkit(molecule, mend=True))
                    written.unwritable.append((molecule.index, why))
                    continue
                written.mended += 1
            text, order = found
            rows.append(f"{text},{molecule.label},g{molecule.index}")
            written.molecules.append(molecule)
            written.orders.append(order)
            # The SD record: the SMILES as RDKit read it (charges, [nH]), put back in TU node
            # order and written in Kekulé form, which keeps the hydrogen an [nH] needs.
            parsed = Chem.MolFromSmiles(text)
            position = {tu_node: k for k, tu_node in enumerate(order)}
            block = Chem.RenumberAtoms(parsed, [position[i] for i in range(len(order))])
            block.SetProp("_Name", f"g{molecule.index}")
            block.SetProp("label", str(molecule.label))
            sdf.write(Chem.MolToMolBlock(block))
            sdf.write(f">  <label>\n{molecule.label}\n\n$$$$\n")
        csv_path.write_text("\n".join(rows) + "\n")
        sdf_path.write_text(sdf.getvalue())
        return written
    finally:
        RDLogger.EnableLog("rdApp.*")


def _why(mol: Any) -> str:
    from rdkit import Chem

    try:
        Chem.SanitizeMol(Chem.Mol(mol))
    except Exception as exc:  # RDKit's sanitisation errors share no public base class
        return " ".join(str(exc).split())
    return "RDKit cannot read its SMILES back"
