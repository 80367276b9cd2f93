"""Standardisation on known cases: salts and solvents stripped, charges neutralised as RDKit's
Uncharger does, functional groups normalised, and the notes saying what changed."""

from __future__ import annotations

import pytest

Chem = pytest.importorskip("rdkit.Chem")

from trellis.silo.data.molecules.standardise import (  # noqa: E402
    CHARGES_NEUTRALISED,
    FRAGMENTS_REMOVED,
    GROUPS_NORMALISED,
    STANDARDISER,
    standardisation_summary,
    standardise,
)


def _standardised(smiles: str) -> tuple[str | None, list[str]]:
    mol, notes = standardise(Chem.MolFromSmiles(smiles))
    return (None if mol is None else Chem.MolToSmiles(mol)), notes


def _canonical(smiles: str) -> str:
    return str(Chem.MolToSmiles(Chem.MolFromSmiles(smiles)))


def test_sodium_acetate_becomes_acetic_acid() -> None:
    smiles, notes = _standardised("CC(=O)[O-].[Na+]")
    assert smiles == _canonical("CC(=O)O")
    assert notes == [FRAGMENTS_REMOVED, CHARGES_NEUTRALISED]


def test_benzene_hydrochloride_becomes_benzene() -> None:
    assert _standardised("c1ccccc1.Cl") == (_canonical("c1ccccc1"), [FRAGMENTS_REMOVED])


def test_solvent_is_stripped() -> None:
    assert _standardised("O.O.CCO") == (_canonical("CCO"), [FRAGMENTS_REMOVED])


def test_zwitterions_are_handled_as_the_uncharger_does() -> None:
    # Glycine: both charges can be neutralised (a proton moves), so the neutral form is kept.
    assert _standardised("[NH3+]CC(=O)[O-]") == (_canonical("NCC(=O)O"), [CHARGES_NEUTRALISED])
    # Betaine: the quaternary nitrogen cannot lose its charge, so the carboxylate keeps its
    # balancing one and the molecule is left as it is.
    betaine = "C[N+](C)(C)CC(=O)[O-]"
    assert _standardised(betaine) == (_canonical(betaine), [])


def test_functional_groups_are_normalised() -> None:
    # A charge-separated sulfone gets its double bonds back; 1,5-separated charges recombine.
    assert _standardised("C[S+2]([O-])([O-])C") == (_canonical("CS(C)(=O)=O"),
                                                    [GROUPS_NORMALISED])
    assert _standardised("C[N+](C)=CC=C[O-]") == (_canonical("CN(C)C=CC=O"),
                                                  [GROUPS_NORMALISED])


def test_a_clean_molecule_is_unchanged_and_the_input_is_not_modified() -> None:
    aspirin = Chem.MolFromSmiles("CC(=O)Oc1ccccc1C(=O)O")
    salt = Chem.MolFromSmiles("CC(=O)[O-].[Na+]")
    mol, notes = standardise(aspirin)
    assert mol is not None and notes == []
    assert Chem.MolToSmiles(mol) == Chem.MolToSmiles(aspirin)
    standardise(salt)
    assert Chem.MolToSmiles(salt) == _canonical("CC(=O)[O-].[Na+]")


def test_a_molecule_left_empty_is_refused_with_a_reason() -> None:
    mol, notes = standardise(Chem.MolFromSmiles(""))
    assert mol is None
    assert notes == ["standardisation left no atoms (the molecule is empty)"]


def test_summary_counts_the_molecules_each_step_changed() -> None:
    notes = [_standardised(s)[1] for s in ("CC(=O)[O-].[Na+]", "c1ccccc1.Cl", "CCO")]
    assert standardisation_summary(notes) == (
        f"standardised 3 molecules ({STANDARDISER}): 2 with {FRAGMENTS_REMOVED}, "
        f"1 with {CHARGES_NEUTRALISED}")
    assert standardisation_summary([[]]).endswith("): none changed")


def test_the_standardiser_is_named_and_versioned() -> None:
    name, version = STANDARDISER.rsplit("/", 1)
    assert name and version.isdigit()
