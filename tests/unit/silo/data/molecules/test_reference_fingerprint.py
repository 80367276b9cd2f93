"""The reference-set fingerprint: the same in every run and process, different for every setting
that changes features, and "" for what is not a molecule featuriser."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("rdkit")

from trellis.silo.data.molecules.features import FEATURISER, featuriser  # noqa: E402
from trellis.silo.data.molecules.fingerprint import (  # noqa: E402
    fingerprint_for,
    reference_fingerprint,
    reference_graphs,
    reference_molecules,
)
from trellis.silo.data.prepared.model import Featuriser  # noqa: E402

# ogb-atom-bond version 1, standardise = false, on reference.smi as shipped. A change here is a
# change of every site's preparation: bump the featuriser's version, never this value alone.
PINNED = "06fed5cfa755f67438c5e801f8e12105483a11920745cd08c1891185c4752357"


def test_the_reference_set_is_40_to_60_named_molecules_all_prepared() -> None:
    molecules = reference_molecules()
    assert 40 <= len(molecules) <= 60
    assert all(name for _, _, name in molecules)
    graphs = reference_graphs(FEATURISER)
    assert len(graphs) == len(molecules)
    keys = {g.key for g in graphs}
    assert {"[Cl-].[Na+]", "CC(=O)[O-]", "CC[C@H](C)O", "C/C=C/C"} <= keys   # salts, stereo
    assert any(g.edge_index.shape[1] == 0 for g in graphs)                  # no bonds at all


def test_the_fingerprint_is_stable_in_this_process_and_another() -> None:
    assert reference_fingerprint(FEATURISER) == PINNED
    assert reference_fingerprint(FEATURISER) == PINNED
    script = ("from trellis.silo.data.molecules.features import FEATURISER\n"
              "from trellis.silo.data.molecules.fingerprint import reference_fingerprint\n"
              "print(reference_fingerprint(FEATURISER))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == PINNED
    assert fingerprint_for(FEATURISER) == PINNED


def test_a_setting_changes_the_fingerprint() -> None:
    standardised = reference_fingerprint(featuriser(standardise=True))
    assert len(standardised) == 64 and standardised != PINNED


def test_a_featuriser_this_trellis_cannot_reproduce_is_an_error() -> None:
    with pytest.raises(ValueError, match="cannot prepare molecules as ogb-atom-bond version 2"):
        reference_fingerprint(Featuriser("ogb-atom-bond", "2", {"standardise": False}))


def test_other_featurisers_have_no_fingerprint() -> None:
    assert fingerprint_for(Featuriser("tu-one-hot", "1", {})) == ""
