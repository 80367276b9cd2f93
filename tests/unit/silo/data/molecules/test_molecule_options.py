"""`--standardise` and `--scaffold-split` reach the molecules a source prepares, and what a
site chose is in the featuriser (so in the fingerprint a plan can name)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("rdkit")

from trellis.silo.data.molecules.fingerprint import reference_fingerprint  # noqa: E402
from trellis.silo.data.molecules.smiles import read  # noqa: E402
from trellis.silo.data.prepared.model import SourceOptions  # noqa: E402

ROWS = ["CC(=O)[O-].[Na+],0", "c1ccccc1.Cl,1", "c1ccccc1C,1", "c1ccccc1CC,1", "C1CCCCC1O,0",
        "C1CCCCC1N,0", "CCO,0", "CCCO,0", "c1ccncc1,1", "c1ccncc1C,1"]


def table(tmp_path: Path) -> Path:
    path = tmp_path / "mols.csv"
    path.write_text("smiles,label\n" + "\n".join(ROWS) + "\n")
    return path


def test_standardised_molecules_lose_salts_and_charges(tmp_path: Path) -> None:
    plain = read(table(tmp_path), SourceOptions())
    standard = read(table(tmp_path), SourceOptions(standardise=True))
    assert plain.graphs[0].key == "CC(=O)[O-].[Na+]" and standard.graphs[0].key == "CC(=O)O"
    assert standard.graphs[1].key == "c1ccccc1"
    assert standard.featuriser.settings["standardiser"].startswith("largest-fragment")
    assert reference_fingerprint(standard.featuriser) != reference_fingerprint(plain.featuriser)


def test_a_scaffold_split_is_made_on_the_molecules_kept(tmp_path: Path) -> None:
    prep = read(table(tmp_path), SourceOptions(scaffold_split=True))
    assert prep.split_kind == "scaffold" and prep.split is not None
    together = sorted(int(i) for part in prep.split.values() for i in part)
    assert together == list(range(len(prep.graphs)))
    assert any("scaffold split" in note for note in prep.notes)
    assert read(table(tmp_path), SourceOptions()).split is None


def test_when_every_row_is_refused_each_reason_is_said_and_nothing_written(
        tmp_path: Path) -> None:
    import subprocess
    import sys

    source = tmp_path / "bad.csv"
    source.write_text("smiles,label\nC1CC,0\n,1\n")
    done = subprocess.run([sys.executable, "-m", "trellis.silo.cli", "data", "prepare",
                           str(source), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "row 2: invalid SMILES 'C1CC': unclosed ring" in done.stderr
    assert "row 3: SMILES column 'smiles' is empty" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "error: bad.csv: no graph could be prepared (2 row(s) refused)")
    assert not (tmp_path / "out").exists()
