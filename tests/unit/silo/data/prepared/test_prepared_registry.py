"""The format registry (silo/data/prepared/registry.py): which format an input is, the reader of
each format imported only when asked for, and one line when it cannot be."""

from __future__ import annotations

from pathlib import Path

import pytest

from trellis.silo.data.prepared import registry, tu_source
from trellis.silo.data.prepared.registry import (
    READERS,
    SourceUnavailable,
    detect_format,
    missing_package,
    reader,
)
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.data.tu import DataFormatError


@pytest.mark.parametrize(("name", "expected"), [
    ("mols.csv", "smiles"), ("mols.TSV", "smiles"), ("mols.sdf", "sdf"), ("mols.sd", "sdf"),
    ("graphs.pt", "pyg"), ("g.gml", "networkx"), ("g.graphml", "networkx"),
    ("g.gexf", "networkx"), ("g.json", "networkx"), ("kg.nt", "rdf"), ("kg.ttl", "rdf"),
    ("kg.n3", "rdf"), ("g.edgelist", "edgelist"), ("g.edges", "edgelist")])
def test_a_file_s_format_is_told_by_its_extension(tmp_path: Path, name: str, expected: str
                                                   ) -> None:
    (tmp_path / name).write_text("x\n")
    assert detect_format(tmp_path / name) == expected


def test_a_tu_folder_or_its_parent_is_tu(tmp_path: Path) -> None:
    folder = write_tu_folder(tmp_path / "demo", "MOL", "molecules", 8, seed=0)
    assert detect_format(folder) == detect_format(tmp_path / "demo") == "tu"


def test_an_ogb_folder_is_told_by_its_layout(tmp_path: Path) -> None:
    full = tmp_path / "ogbg_molhiv"
    for part in ("mapping", "raw", "split"):
        (full / part).mkdir(parents=True)
    assert detect_format(full) == "ogb"
    bare = tmp_path / "bare" / "raw"
    bare.mkdir(parents=True)
    (bare / "edge.csv.gz").write_bytes(b"")
    assert detect_format(tmp_path / "bare") == "ogb"


def test_what_cannot_be_told_asks_for_format(tmp_path: Path) -> None:
    (tmp_path / "notes.docx").write_text("x")
    with pytest.raises(DataFormatError, match=r"notes.docx: cannot tell the format from its "
                                              r"name; name it with --format \(tu, smiles,"):
        detect_format(tmp_path / "notes.docx")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataFormatError, match="neither a TU dataset .* nor an OGB dataset"):
        detect_format(tmp_path / "empty")
    with pytest.raises(DataFormatError, match="missing.csv: no such file or folder"):
        detect_format(tmp_path / "missing.csv")


def test_every_format_has_a_reader_and_tu_is_ours() -> None:
    assert set(READERS) == {"tu", "smiles", "sdf", "ogb", "pyg", "networkx", "edgelist", "rdf"}
    assert set(registry.SUFFIXES.values()) < set(READERS)
    assert reader("tu") is tu_source.read
    with pytest.raises(DataFormatError, match="--format 'csv': valid choices: tu, smiles"):
        reader("csv")


def test_a_reader_not_in_this_version_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(READERS, "later", "trellis.silo.data.not_yet.later:read")
    with pytest.raises(SourceUnavailable, match="^format later is not available in this "
                                                "version$"):
        reader("later")
    monkeypatch.setitem(READERS, "later", "trellis.silo.data.prepared.tu_source:not_here")
    with pytest.raises(SourceUnavailable, match="not available in this version"):
        reader("later")


def test_a_missing_library_names_the_extra_that_brings_it() -> None:
    missing = missing_package(ModuleNotFoundError("No module named 'rdkit'", name="rdkit.Chem"),
                              "format sdf")
    assert str(missing) == ("format sdf needs rdkit, which is not installed: "
                            "pip install 'trellis-fgl[data]'")
    other = missing_package(ModuleNotFoundError("x", name="pandas"), "format smiles")
    assert str(other) == "format smiles needs the Python package 'pandas', which is not installed"
