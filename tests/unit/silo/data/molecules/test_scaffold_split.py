"""The Bemis-Murcko scaffold split: DeepChem's order of scaffold groups, whole groups per part,
the 80/10/10 shares, determinism, and acyclic molecules sharing the empty scaffold."""

from __future__ import annotations

import numpy as np
import pytest

Chem = pytest.importorskip("rdkit.Chem")

from trellis.silo.data.molecules.scaffold import (  # noqa: E402
    murcko_scaffold,
    scaffold_groups,
    scaffold_split,
)

# Side chains to hang off each ring system, so every scaffold has several members.
CHAINS = ["C", "CC", "CCC", "OC", "NC", "ClC", "FC", "OC(=O)", "COC", "CCCC", "C=CC", "BrC"]
RINGS = {"c1ccccc1": 10, "C1CCCCC1": 6, "c1ccncc1": 5, "C1CCOC1": 4, "c1ccc2ccccc2c1": 3}


def _molecules() -> list[str]:
    """40 SMILES: five ring systems with 3 to 10 members each, and 12 acyclic molecules."""
    # Round robin over the ring systems, so no group is contiguous in the input.
    ring_molecules = [f"{CHAINS[k]}{ring}" for k in range(len(CHAINS))
                      for ring, count in RINGS.items() if k < count]
    acyclic = ["CCO", "CCN", "CCCC", "CC(C)O", "CCOCC", "CC(=O)O", "NCC(=O)O", "CCCCCC",
               "ClCCCl", "OCCO", "CC=O", "CS"]
    return ring_molecules[:14] + acyclic + ring_molecules[14:]


def _scaffold_of(smiles: str) -> str:
    return murcko_scaffold(Chem.MolFromSmiles(smiles))


def test_acyclic_molecules_share_the_empty_scaffold() -> None:
    assert {_scaffold_of(s) for s in ("CCO", "CCN", "CC(=O)O", "ClCCCl")} == {""}
    assert _scaffold_of("CCc1ccccc1") == _scaffold_of("OC(=O)c1ccccc1") == "c1ccccc1"


def test_chirality_is_ignored() -> None:
    assert _scaffold_of("C[C@H]1CC[C@@H](C1)c1ccccc1") == _scaffold_of("CC1CCC(C1)c1ccccc1")


def test_no_scaffold_is_in_two_parts_and_every_molecule_in_one() -> None:
    molecules = _molecules()
    split = scaffold_split(molecules)
    assert sorted(np.concatenate(list(split.values())).tolist()) == list(range(len(molecules)))
    owner: dict[str, str] = {}
    for part, indices in split.items():
        assert indices.dtype == np.int64 and np.all(np.diff(indices) > 0)
        for i in indices.tolist():
            assert owner.setdefault(_scaffold_of(molecules[i]), part) == part


def test_sizes_follow_the_groups_largest_first() -> None:
    molecules = _molecules()
    split = scaffold_split(molecules)
    # 40 molecules, cut-offs 32 and 36. Groups largest first: acyclic 12, benzene 10 and
    # cyclohexane 6 go to training (28); pyridine's 5 would pass 32 and goes to validation;
    # THF's 4 still fits training (32); naphthalene's 3 would pass 36 and goes to test.
    assert [len(split[p]) for p in ("train", "val", "test")] == [32, 5, 3]
    assert {_scaffold_of(molecules[i]) for i in split["val"]} == {"c1ccncc1"}
    assert {_scaffold_of(molecules[i]) for i in split["test"]} == {"c1ccc2ccccc2c1"}
    assert {_scaffold_of(molecules[i]) for i in split["train"]} == {
        "", "c1ccccc1", "C1CCCCC1", "C1CCOC1"}


def test_groups_of_one_size_go_in_deepchems_order() -> None:
    # Two scaffolds of two molecules each: DeepChem sorts (size, first index) in reverse, so
    # the group whose first molecule comes later is taken first.
    groups = scaffold_groups(["c1ccccc1C", "C1CCCCC1C", "c1ccccc1CC", "C1CCCCC1CC", "CCO"])
    assert groups == [[1, 3], [0, 2], [4]]


def test_the_split_is_deterministic_and_takes_molecules_or_smiles() -> None:
    molecules = _molecules()
    first = scaffold_split(molecules)
    again = scaffold_split([Chem.MolFromSmiles(s) for s in molecules])
    for part in ("train", "val", "test"):
        assert np.array_equal(first[part], again[part])


def test_other_fractions_and_bad_input() -> None:
    split = scaffold_split(_molecules(), fractions=(0.5, 0.25, 0.25))
    assert sum(len(v) for v in split.values()) == 40 and len(split["train"]) <= 20
    with pytest.raises(ValueError, match="sum to 1"):
        scaffold_split(["CCO"], fractions=(0.8, 0.1, 0.2))
    with pytest.raises(ValueError, match=r"molecule 2: invalid SMILES 'C1CC'"):
        scaffold_split(["CCO", "C1CC"])
    assert all(v.size == 0 for v in scaffold_split([]).values())
