"""Molecule standardisation before featurising: keep the largest fragment (salts and solvents go),
normalise functional groups, neutralise charges (RDKit's rdMolStandardize; docs/data/splits.md).

Two sites that record the same compound as a sodium salt and as the free acid featurise it the
same way only when both standardise. What this does is versioned (``STANDARDISER``): the
featuriser's settings carry it, so the reference-set fingerprint changes when the steps do.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rdkit.Chem import Mol

# Bump the version whenever the steps, their order or their options change.
STANDARDISER_NAME = "largest-fragment+normalise+uncharge"
STANDARDISER_VERSION = "1"
STANDARDISER = f"{STANDARDISER_NAME}/{STANDARDISER_VERSION}"

# The notes `standardise` returns for a molecule it changed, one per step that changed it.
FRAGMENTS_REMOVED = "fragments removed (salts, solvents)"
GROUPS_NORMALISED = "functional groups normalised"
CHARGES_NEUTRALISED = "charges neutralised"


def standardise(mol: Mol) -> tuple[Mol | None, list[str]]:
    """The standardised molecule and a note per step that changed it; (None, [reason]) when
    standardisation leaves nothing to featurise."""
    from rdkit import Chem
    from rdkit.Chem.MolStandardize import rdMolStandardize

    if mol.GetNumAtoms() == 0:
        return None, ["standardisation left no atoms (the molecule is empty)"]
    notes: list[str] = []
    try:
        fragments = len(Chem.GetMolFrags(mol))
        # Largest by atom count, as RDKit's FragmentParent chooses: acetate over Na+.
        current = rdMolStandardize.LargestFragmentChooser().choose(mol)
        if fragments > 1:
            notes.append(FRAGMENTS_REMOVED)
        before = Chem.MolToSmiles(current)
        current = rdMolStandardize.Normalizer().normalize(current)
        normalised = Chem.MolToSmiles(current)
        if normalised != before:
            notes.append(GROUPS_NORMALISED)
        # Uncharger adds or removes hydrogens where it can; a charge it cannot neutralise (a
        # quaternary ammonium and its balancing carboxylate) is kept, as RDKit decides.
        current = rdMolStandardize.Uncharger().uncharge(current)
        if Chem.MolToSmiles(current) != normalised:
            notes.append(CHARGES_NEUTRALISED)
    except (RuntimeError, ValueError) as exc:     # RDKit's sanitisation and kekulisation errors
        return None, [f"standardisation failed: {' '.join(str(exc).split())}"]
    if current.GetNumAtoms() == 0:
        return None, ["standardisation left no atoms"]
    return current, notes


def standardisation_summary(notes: Iterable[Sequence[str]]) -> str:
    """One line counting the molecules each step changed, e.g. "standardised 40 molecules:
    12 with fragments removed (salts, solvents), 3 with charges neutralised"."""
    total = 0
    counts: Counter[str] = Counter()
    for per_molecule in notes:
        total += 1
        counts.update(set(per_molecule))
    changed = [f"{counts[note]} with {note}"
               for note in (FRAGMENTS_REMOVED, GROUPS_NORMALISED, CHARGES_NEUTRALISED)
               if counts[note]]
    return (f"standardised {total} molecule{'s' if total != 1 else ''} ({STANDARDISER}): "
            + (", ".join(changed) if changed else "none changed"))
