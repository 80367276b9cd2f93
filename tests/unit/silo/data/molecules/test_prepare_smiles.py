"""SMILES tables: good rows become graphs keyed by canonical SMILES; every bad row is one
Refusal with its line; a file that cannot be read at all is one DataFormatError."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("rdkit")

from trellis.silo.data.molecules.smiles import read  # noqa: E402
from trellis.silo.data.prepared.model import Refusal, SourceOptions  # noqa: E402
from trellis.silo.data.tu import DataFormatError  # noqa: E402

TABLE = """id,smiles,label
a,OCC,1
b,C1CC,0

c,,1
d,c1ccccc1,
e,CCN,maybe
f,C(C)(C)(C)(C)C,1
g,CC(=O)O,true
h,"CC
O",0
i,C,1,extra
j,c1ccncc1,False
"""


def _write(tmp_path: Path, text: str, name: str = "mols.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_good_rows_become_graphs_and_every_bad_row_a_refusal(tmp_path: Path,
                                                              capfd: pytest.CaptureFixture[str]
                                                              ) -> None:
    prep = read(_write(tmp_path, TABLE), SourceOptions(id_column="id"))
    assert [(g.origin, g.key, g.label) for g in prep.graphs] == [
        ("mols.csv:2 (id a)", "CCO", 1), ("mols.csv:9 (id g)", "CC(=O)O", 1),
        ("mols.csv:13 (id j)", "c1ccncc1", 0)]
    assert prep.refused == [
        Refusal("mols.csv", "3", "invalid SMILES 'C1CC': unclosed ring"),
        Refusal("mols.csv", "5", "SMILES column 'smiles' is empty"),
        Refusal("mols.csv", "6", "label column 'label' is empty"),
        Refusal("mols.csv", "7", "label 'maybe' in column 'label' is not an integer "
                                 "(or true/false)"),
        Refusal("mols.csv", "8", "invalid SMILES 'C(C)(C)(C)(C)C': Explicit valence for atom "
                                 "# 0 C, 5, is greater than permitted"),
        Refusal("mols.csv", "11", "SMILES 'CC\\nO' has a space or line break inside it"),
        Refusal("mols.csv", "12", "4 cells where the header has 3"),
    ]
    assert prep.featuriser.name == "ogb-atom-bond" and prep.name == "mols"
    assert prep.sources == [tmp_path / "mols.csv"]
    # RDKit's complaints are the refusals' reasons now, not lines on stderr.
    assert capfd.readouterr().err == ""


def test_a_tsv_by_its_extension_and_other_column_names(tmp_path: Path) -> None:
    path = _write(tmp_path, "mol\tactive\nCCO\t1\n", "set.tsv")
    prep = read(path, SourceOptions(smiles_column="mol", label_column="active", name="x"))
    assert [g.key for g in prep.graphs] == ["CCO"] and prep.name == "x"


@pytest.mark.parametrize(("text", "name", "options", "message"), [
    ("mol,label\nCCO,1\n", "m.csv", SourceOptions(),
     "m.csv: line 1: no column 'smiles' (the header has 'mol', 'label'); name the right one "
     "with --smiles-column"),
    ("smiles,y\nCCO,1\n", "m.csv", SourceOptions(),
     "m.csv: line 1: no column 'label' (the header has 'smiles', 'y'); name the right one with "
     "--label-column"),
    ("smiles,label\nCCO,1\n", "m.csv", SourceOptions(id_column="name"),
     "m.csv: line 1: no column 'name'"),
    ("", "m.csv", SourceOptions(), "m.csv: empty: expected a header line"),
    ("smiles,label\n", "m.dat", SourceOptions(),
     "m.dat: cannot tell the separator from the extension '.dat'; name it with --separator"),
])
def test_what_stops_the_whole_file(tmp_path: Path, text: str, name: str,
                                   options: SourceOptions, message: str) -> None:
    with pytest.raises(DataFormatError) as caught:
        read(_write(tmp_path, text, name), options)
    assert str(caught.value).startswith(message)


def test_text_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_bytes(b"smiles,label\nCCO,1\n\xff\xfe,0\n")
    with pytest.raises(DataFormatError, match="m.csv: not UTF-8 text"):
        read(path, SourceOptions())


def test_a_separator_option_overrides_the_extension(tmp_path: Path) -> None:
    path = _write(tmp_path, "smiles;label\nCCO;1\n", "m.txt")
    assert len(read(path, SourceOptions(separator=";")).graphs) == 1
