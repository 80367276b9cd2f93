"""SD files: each record on its own; a broken or truncated record is its refusal, with its
number and line; labels from a property or from a CSV matched by the molecule's name."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

pytest.importorskip("rdkit")

from rdkit import Chem  # noqa: E402

from trellis.silo.data.molecules.sdf import read  # noqa: E402
from trellis.silo.data.prepared.model import SourceOptions  # noqa: E402
from trellis.silo.data.tu import DataFormatError  # noqa: E402


def _record(smiles: str, name: str, label: str | None) -> str:
    mol = Chem.MolFromSmiles(smiles)
    mol.SetProp("_Name", name)
    if label is not None:
        mol.SetProp("activity", label)
    out = io.StringIO()
    with Chem.SDWriter(out) as writer:
        writer.write(mol)
    return out.getvalue()


ETHANOL = _record("CCO", "ethanol", "1")
BENZENE = _record("c1ccccc1", "benzene", "0")
ACETIC = _record("CC(=O)O", "acetic acid", "x")
AMINE = _record("CCN", "ethylamine", None)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mols.sdf"
    path.write_text(text)
    return path


def test_labels_from_a_property_and_every_bad_record_refused(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    broken = BENZENE.replace("  6  6", "  9  6", 1)    # more atoms claimed than listed
    path = _write(tmp_path, ETHANOL + broken + ACETIC + AMINE + ETHANOL + "\n\n")
    prep = read(path, SourceOptions(label_property="activity"))
    assert [(g.origin, g.key, g.label) for g in prep.graphs] == [
        ("mols.sdf:1", "CCO", 1), ("mols.sdf:5", "CCO", 1)]
    benzene_line = ETHANOL.count("\n") + 1
    reasons = {r.row: r.reason for r in prep.refused}
    assert sorted(reasons) == ["2", "3", "4"]
    assert reasons["2"].startswith(f"at line {benzene_line} ('benzene'): Atom line too short")
    assert reasons["3"].endswith("('acetic acid'): label 'x' (property 'activity') is not an "
                                 "integer (or true/false)")
    assert reasons["4"].endswith("('ethylamine'): no property 'activity' (the record has none)")
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("cut", [3, 40, 400])
def test_a_file_that_ends_inside_a_record_refuses_that_record_as_truncated(
        tmp_path: Path, cut: int) -> None:
    path = _write(tmp_path, ETHANOL + BENZENE[:-cut])
    prep = read(path, SourceOptions(label_property="activity"))
    assert [g.key for g in prep.graphs] == ["CCO"]
    (refusal,) = prep.refused
    assert refusal.row == "2"
    assert "('benzene'): truncated: the file ends inside this record, before its '$$$$' " \
           "line" in refusal.reason


def test_labels_from_a_csv_by_molecule_name(tmp_path: Path) -> None:
    path = _write(tmp_path, ETHANOL + BENZENE + AMINE)
    labels = tmp_path / "labels.csv"
    labels.write_text("id,label\nbenzene,2\nethanol,true\n")
    prep = read(path, SourceOptions(labels=labels))
    assert [(g.key, g.label) for g in prep.graphs] == [("CCO", 1), ("c1ccccc1", 2)]
    assert [r.reason for r in prep.refused] == [
        f"at line {(ETHANOL + BENZENE).count(chr(10)) + 1} ('ethylamine'): no label for "
        "'ethylamine' "
        "in labels.csv"]
    assert prep.sources == [path, labels]


def test_a_labels_csv_naming_a_molecule_twice_stops_the_file(tmp_path: Path) -> None:
    labels = tmp_path / "labels.csv"
    labels.write_text("id,label\nethanol,1\nbenzene,0\nethanol,0\n")
    with pytest.raises(DataFormatError, match="labels.csv: line 4: id 'ethanol' again "
                                              r"\(first on line 2\)"):
        read(_write(tmp_path, ETHANOL), SourceOptions(labels=labels))


@pytest.mark.parametrize(("options", "fragment"), [
    (SourceOptions(), "one of them"),
    (SourceOptions(label_property="y", labels=Path("l.csv")), "not both"),
])
def test_labels_come_from_exactly_one_place(tmp_path: Path, options: SourceOptions,
                                            fragment: str) -> None:
    with pytest.raises(DataFormatError, match=f"mols.sdf: give the labels .*{fragment}"):
        read(_write(tmp_path, ETHANOL), options)
