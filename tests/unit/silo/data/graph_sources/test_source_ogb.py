"""The OGB graph-property source: a tiny folder laid out as OGB ships ogbg-molhiv."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from trellis.silo.data.graph_sources import ogb
from trellis.silo.data.prepared.model import SourceOptions
from trellis.silo.data.tu import DataFormatError


def _gz(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress("".join(line + "\n" for line in lines).encode()))


def make_ogb_folder(root: Path, *, labels: list[str] | None = None,
                    header: str = "HIV_active,smiles,mol_id") -> Path:
    """Three molecules: C-O (2 atoms), C=C-C (3 atoms, a bond each way), a lone N."""
    folder = root / "ogbg_molhiv"
    raw = folder / "raw"
    _gz(raw / "num-node-list.csv.gz", ["2", "3", "1"])
    _gz(raw / "num-edge-list.csv.gz", ["1", "2", "0"])
    _gz(raw / "edge.csv.gz", ["0,1", "0,1", "1,2"])
    # atomic number index (C=5, O=7, N=6), then the eight other OGB atom columns
    _gz(raw / "node-feat.csv.gz", ["5,0,1,5,3,0,2,0,0", "7,0,1,5,1,0,2,0,0",
                                   "5,0,1,5,2,0,1,0,0", "5,0,2,5,1,0,1,0,0",
                                   "5,0,1,5,3,0,2,0,0", "6,0,0,5,3,0,2,0,0"])
    _gz(raw / "edge-feat.csv.gz", ["0,0,0", "1,0,1", "0,0,1"])
    _gz(raw / "graph-label.csv.gz", labels or ["0", "1", "0"])
    _gz(folder / "mapping" / "mol.csv.gz", [header, "0,CO,0"])
    _gz(folder / "split" / "scaffold" / "train.csv.gz", ["0", "2"])
    _gz(folder / "split" / "scaffold" / "valid.csv.gz", ["1"])
    _gz(folder / "split" / "scaffold" / "test.csv.gz", [])
    return folder


def test_an_ogb_molecule_folder_becomes_one_hot_graphs_with_both_edge_directions(
        tmp_path: Path) -> None:
    prep = ogb.read(make_ogb_folder(tmp_path), SourceOptions())
    assert prep.name == "ogbg-molhiv"
    assert prep.featuriser.name == "ogb-mol-one-hot"
    assert prep.featuriser.settings["atom_dims"] == list(ogb.OGB_ATOM_FEATURE_DIMS)
    assert [g.label for g in prep.graphs] == [0, 1, 0]
    first, second, third = prep.graphs
    assert first.x.shape == (2, 174) and first.x.dtype == np.float32
    assert first.x[:, :119].argmax(axis=1).tolist() == [5, 7]
    assert first.x.sum(axis=1).tolist() == [9.0, 9.0]
    assert first.edge_index.tolist() == [[0, 1], [1, 0]]
    assert first.edge_attr is not None and first.edge_attr.shape == (2, 13)
    assert second.edge_index.tolist() == [[0, 1, 1, 2], [1, 0, 2, 1]]
    assert second.edge_attr is not None
    assert second.edge_attr[:, :5].argmax(axis=1).tolist() == [1, 1, 0, 0]
    assert third.edge_index.shape == (2, 0)
    assert prep.split_kind == "ogb-scaffold"
    assert prep.split is not None
    assert {k: v.tolist() for k, v in prep.split.items()} == {"train": [0, 2], "val": [1],
                                                              "test": []}
    assert {p.name for p in prep.sources} >= {"edge.csv.gz", "graph-label.csv.gz",
                                              "train.csv.gz", "mol.csv.gz"}
    assert prep.refused == []


def test_a_nan_label_is_a_refusal_and_leaves_the_split(tmp_path: Path) -> None:
    prep = ogb.read(make_ogb_folder(tmp_path, labels=["0", "", "1"]), SourceOptions())
    assert [g.label for g in prep.graphs] == [0, 1]
    assert [(r.source, r.row) for r in prep.refused] == [("graph-label.csv.gz", "2")]
    assert "HIV_active has no label" in prep.refused[0].reason
    assert prep.split is not None
    assert prep.split["train"].tolist() == [0, 1] and prep.split["val"].tolist() == []


def test_a_multi_task_folder_needs_the_task_named(tmp_path: Path) -> None:
    folder = make_ogb_folder(tmp_path, labels=["0,1", "1,", "0,0"],
                             header="A,B,smiles,mol_id")
    with pytest.raises(DataFormatError, match="2 task columns; choose one with --label-column"):
        ogb.read(folder, SourceOptions())
    by_name = ogb.read(folder, SourceOptions(label_column="B"))
    assert [g.label for g in by_name.graphs] == [1, 0]
    assert by_name.refused[0].row == "2"
    by_index = ogb.read(folder, SourceOptions(label_column="0"))
    assert [g.label for g in by_index.graphs] == [0, 1, 0]
    with pytest.raises(DataFormatError, match="'C' is not one of its tasks: A, B"):
        ogb.read(folder, SourceOptions(label_column="C"))


def test_mistakes_name_the_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="not an OGB graph-property folder"):
        ogb.read(tmp_path, SourceOptions())
    folder = make_ogb_folder(tmp_path)
    _gz(folder / "raw" / "edge.csv.gz", ["0,1", "0,x", "1,2"])
    with pytest.raises(DataFormatError, match=r"^edge.csv.gz: line 2: 'x' is not an integer$"):
        ogb.read(folder, SourceOptions())
    _gz(folder / "raw" / "edge.csv.gz", ["0,1", "0,1"])
    with pytest.raises(DataFormatError, match="2 edges, but num-edge-list.csv.gz counts 3"):
        ogb.read(folder, SourceOptions())
    _gz(folder / "raw" / "edge.csv.gz", ["0,1", "0,1", "1,2"])
    _gz(folder / "raw" / "graph-label.csv.gz", ["0.5", "1.5", "2"])
    with pytest.raises(DataFormatError, match="line 1: label '0.5' is not an integer class"):
        ogb.read(folder, SourceOptions())
    _gz(folder / "raw" / "graph-label.csv.gz", ["0", "1", "0"])
    _gz(folder / "raw" / "node-feat.csv.gz", ["5,0,1,5,3,0,2,0,0"] * 5 + ["5,0,1,5,3,0,9,0,0"])
    with pytest.raises(DataFormatError, match="node-feat.csv.gz: line 6: column 7 is 9, outside"):
        ogb.read(folder, SourceOptions())


def test_an_edge_outside_its_graph_refuses_that_graph(tmp_path: Path) -> None:
    folder = make_ogb_folder(tmp_path)
    _gz(folder / "raw" / "edge.csv.gz", ["0,2", "0,1", "1,2"])
    prep = ogb.read(folder, SourceOptions())
    assert [g.origin for g in prep.graphs] == ["graph-label.csv.gz:2", "graph-label.csv.gz:3"]
    assert prep.refused[0].source == "edge.csv.gz" and prep.refused[0].row == "1"


def test_a_dataset_without_categorical_atoms_keeps_its_floats(tmp_path: Path) -> None:
    folder = make_ogb_folder(tmp_path)
    (folder / "raw" / "node-feat.csv.gz").unlink()
    renamed = folder.rename(tmp_path / "ogbg_ppa")
    prep = ogb.read(renamed, SourceOptions())
    assert prep.featuriser.name == "ogb-as-given"
    assert prep.graphs[0].x.tolist() == [[1.0], [1.0]]
    assert prep.graphs[0].edge_attr is not None and prep.graphs[0].edge_attr.shape == (2, 3)
    assert any("constant feature" in note for note in prep.notes)
