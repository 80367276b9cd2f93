"""The prepared folder (silo/data/prepared/folder.py, arrays.py): a TU folder written and read
back is the dataset the TU loader makes, the manifest says what docs/data/format.md says, a
failed or interrupted write leaves nothing, and a corrupt folder is refused in one line."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.support.prepared_sources import FEATURISER, rings
from trellis.silo.data.datasets import load_graph_folder
from trellis.silo.data.graph import Graph
from trellis.silo.data.hetero import HeteroGraph, load_hetero_folder
from trellis.silo.data.prepared import tu_source
from trellis.silo.data.prepared.folder import (
    FORMAT,
    GRAPHS,
    MANIFEST,
    RowsRefused,
    atomic_folder,
    is_prepared_folder,
    load_prepared,
    read_manifest,
    write_prepared,
    write_prepared_hetero,
)
from trellis.silo.data.prepared.model import (
    Featuriser,
    Preparation,
    PreparedGraph,
    Refusal,
    SourceOptions,
)
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.data.tu import DataFormatError, GraphDataset, load_tu_folder

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _fields(graph: Graph) -> set[str]:
    """The fields a graph carries (those set)."""
    return {name for name, value in vars(graph).items() if value is not None}


def _same_graphs(a: GraphDataset, b: GraphDataset) -> None:
    assert len(a.graphs) == len(b.graphs)
    assert (a.num_classes, a.num_features) == (b.num_classes, b.num_features)
    for left, right in zip(a.graphs, b.graphs, strict=True):
        assert _fields(left) == _fields(right)
        assert left.num_nodes == right.num_nodes
        assert torch.equal(left.x, right.x) and left.x.dtype == right.x.dtype
        assert torch.equal(left.edge_index, right.edge_index)
        assert torch.equal(left.y, right.y)


@pytest.mark.parametrize(("domain", "gz"), [("molecules", False), ("social", True), ("bio", False)])
def test_a_tu_folder_prepared_and_loaded_is_what_the_tu_loader_makes(tmp_path: Path, domain: str,
                                                                      gz: bool) -> None:
    folder = write_tu_folder(tmp_path / "tu", "DS", domain, 30, seed=3, gz=gz)
    direct = load_tu_folder(folder)
    prep = tu_source.read(tmp_path / "tu", SourceOptions())       # its only TU subfolder
    out = write_prepared(prep, tmp_path / "prepared", strict=False)
    assert is_prepared_folder(out) and not is_prepared_folder(folder)
    loaded = load_prepared(out)
    _same_graphs(loaded, direct)
    assert loaded.name == "DS" and loaded.split is None
    assert loaded.feature_kind == "tu-one-hot"
    assert direct.encoding is not None and loaded.encoding is not None
    assert loaded.encoding.kind == "prepared"
    assert loaded.encoding.classes == direct.encoding.classes
    # `silo join --data` and `silo serve --data` take either folder.
    _same_graphs(load_graph_folder(out), direct)
    _same_graphs(load_graph_folder(tmp_path / "tu"), direct)


def test_the_manifest_says_where_the_graphs_came_from_and_what_they_are(tmp_path: Path) -> None:
    folder = write_tu_folder(tmp_path / "tu", "MOL", "molecules", 20, seed=1)
    prep = tu_source.read(folder, SourceOptions(name="chem"))
    write_prepared(prep, tmp_path / "out", strict=False, fingerprint="ab" * 32, now=NOW)
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert manifest["format"] == FORMAT == "trellis-prepared/1"
    assert (manifest["task"], manifest["name"]) == ("graph", "chem")
    assert manifest["created_at"] == "2026-01-02T03:04:05Z"
    files = sorted(p for p in folder.iterdir())
    assert manifest["sources"] == [{"name": p.name,
                                    "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
                                    "bytes": p.stat().st_size} for p in files]
    assert manifest["featuriser"] == {"name": "tu-one-hot", "version": "1",
                                      "settings": {"features": "node_labels"}}
    assert manifest["fingerprint"] == "ab" * 32
    assert set(manifest["versions"]) == {"trellis", "python", "numpy", "rdkit",
                                         "torch_geometric"}
    assert manifest["versions"]["numpy"] == np.__version__
    labels = [g.label for g in prep.graphs]
    assert manifest["counts"] == {"graphs": 20, "refused": 0,
                                  "classes": {str(v): labels.count(v) for v in sorted(set(labels))}}
    nodes = [g.x.shape[0] for g in prep.graphs]
    assert manifest["stats"]["nodes"] == {"min": min(nodes), "max": max(nodes),
                                          "mean": round(sum(nodes) / len(nodes), 3)}
    assert manifest["stats"]["node_features"] == prep.graphs[0].x.shape[1]
    assert manifest["stats"]["edge_features"] == 0
    assert (manifest["refused"], manifest["split"], manifest["notes"]) == ([], None, [])
    with np.load(tmp_path / "out" / GRAPHS, allow_pickle=False) as npz:
        assert set(npz.files) == {"x", "edge_index", "node_ptr", "edge_ptr", "y", "origin"}
        assert npz["origin"][0] == "MOL_graph_labels.txt:1"


def _rich_preparation(source: Path) -> Preparation:
    """Graphs with edge features and keys, refused rows, a split and a note."""
    graphs = rings(8, source.name)
    for graph in graphs:
        graph.edge_attr = np.arange(graph.edge_index.shape[1] * 2, dtype=np.float32).reshape(-1, 2)
        graph.key = f"ring-{graph.x.shape[0]}"
    split = {"train": np.arange(6), "val": np.array([6]), "test": np.array([7])}
    return Preparation(graphs=graphs, refused=[Refusal(source.name, "9", "no label")],
                       featuriser=Featuriser("test-ring", "2", {"standardise": True}),
                       sources=[source], name="rings", split=split, split_kind="scaffold",
                       notes=["standardised: 0 salts stripped"])


def test_edge_features_keys_refusals_and_a_split_survive_the_round_trip(tmp_path: Path) -> None:
    source = tmp_path / "rings.txt"
    source.write_text("rings\n")
    prep = _rich_preparation(source)
    write_prepared(prep, tmp_path / "out", strict=False)
    loaded = load_prepared(tmp_path / "out")
    for graph, data in zip(prep.graphs, loaded.graphs, strict=True):
        assert np.array_equal(data.edge_attr.numpy(), graph.edge_attr)
        assert np.array_equal(data.edge_index.numpy(), graph.edge_index)
    assert loaded.split is not None
    assert {k: v.tolist() for k, v in loaded.split.items()} == {
        "train": list(range(6)), "val": [6], "test": [7]}
    manifest = read_manifest(tmp_path / "out")
    assert manifest["split"] == {"kind": "scaffold", "train": 6, "val": 1, "test": 1}
    assert manifest["refused"] == [{"source": "rings.txt", "row": "9", "reason": "no label"}]
    assert manifest["counts"]["refused"] == 1
    assert manifest["stats"]["edge_features"] == 2
    assert manifest["notes"] == ["standardised: 0 salts stripped"]


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_an_existing_folder_with_something_in_it_is_refused_and_left_alone(tmp_path: Path
                                                                             ) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine\n")
    prep = Preparation(rings(8), [], FEATURISER, [], "rings")
    with pytest.raises(DataFormatError, match="already exists and is not an empty folder"):
        write_prepared(prep, out, strict=False)
    assert _listing(out) == ["keep.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataFormatError, match="already exists"):
        write_prepared(prep, tmp_path / "file", strict=False)
    (out / "keep.txt").unlink()        # an empty folder is fine
    write_prepared(prep, out, strict=False)
    assert _listing(out) == [GRAPHS, MANIFEST]


def test_strict_refuses_a_preparation_with_refused_rows_and_writes_nothing(tmp_path: Path
                                                                             ) -> None:
    refused = [Refusal("m.csv", "3", "invalid SMILES 'C1CC': unclosed ring"),
               Refusal("m.csv", "5", "label column 'y' is empty")]
    prep = Preparation(rings(8), refused, FEATURISER, [], "rings")
    with pytest.raises(RowsRefused) as caught:
        write_prepared(prep, tmp_path / "out", strict=True)
    assert str(caught.value).startswith("m.csv: row 3: invalid SMILES 'C1CC': unclosed ring")
    assert caught.value.refused == refused
    assert _listing(tmp_path) == []
    write_prepared(prep, tmp_path / "out", strict=False)       # --keep-going
    assert read_manifest(tmp_path / "out")["counts"]["refused"] == 2


@pytest.mark.parametrize(("spoil", "message"), [
    (lambda g: setattr(g[4], "edge_index", np.array([[0, 9], [9, 0]])),
     "rings.txt:5: an edge names a node outside 0..6"),
    (lambda g: setattr(g[2], "x", np.zeros((5, 4), np.float32)),
     "rings.txt:3: 4 node features, while the graphs before have 3"),
    (lambda g: setattr(g[1], "x", np.full((4, 3), np.nan, np.float32)),
     "rings.txt:2: a node feature is NaN or infinite"),
    (lambda g: setattr(g[0], "x", np.zeros((0, 3), np.float32)),
     r"rings.txt:1: node features must be \[nodes >= 1, features\]"),
])
def test_a_source_whose_arrays_are_wrong_writes_nothing(tmp_path: Path, spoil: Callable[..., Any],
                                                        message: str) -> None:
    graphs = rings(8)
    spoil(graphs)
    with pytest.raises(DataFormatError, match=message):
        write_prepared(Preparation(graphs, [], FEATURISER, [], "rings"), tmp_path / "out",
                       strict=False)
    assert _listing(tmp_path) == []


def test_no_graph_at_all_is_refused(tmp_path: Path) -> None:
    prep = Preparation([], [Refusal("m.csv", "2", "no label")], FEATURISER,
                       [tmp_path / "m.csv"], "m")
    with pytest.raises(DataFormatError, match=r"m.csv: no graph could be prepared \(1 row"):
        write_prepared(prep, tmp_path / "out", strict=False)


class _Interrupted(list[PreparedGraph]):
    """Graphs whose listing is interrupted after three (Ctrl-C while the folder is written)."""

    def __iter__(self) -> Iterator[PreparedGraph]:
        for index, graph in enumerate(list.__iter__(self)):
            if index == 3:
                raise KeyboardInterrupt
            yield graph


def test_a_write_interrupted_half_way_leaves_nothing_behind(tmp_path: Path) -> None:
    prep = Preparation(_Interrupted(rings(8)), [], FEATURISER, [], "rings")
    with pytest.raises(KeyboardInterrupt):
        write_prepared(prep, tmp_path / "out", strict=False)
    assert _listing(tmp_path) == []
    # The folder being written exists until the end, beside the output, hidden.
    with pytest.raises(RuntimeError), atomic_folder(tmp_path / "out") as work:
        (work / "half").write_text("half\n")
        assert work.parent == tmp_path and work.name.startswith(".out.partial-")
        raise RuntimeError("disk full")
    assert _listing(tmp_path) == []


def _good_folder(tmp_path: Path) -> Path:
    out = tmp_path / "good"
    write_prepared(Preparation(rings(8), [], FEATURISER, [], "rings"), out, strict=False)
    return out


def _rewrite_arrays(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    with np.load(folder / GRAPHS, allow_pickle=False) as npz:
        arrays: dict[str, Any] = {k: npz[k] for k in npz.files}
    change(arrays)
    (folder / GRAPHS).unlink()
    np.savez(folder / GRAPHS, **arrays)


def _rewrite_manifest(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    manifest = json.loads((folder / MANIFEST).read_text())
    change(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))


CORRUPTIONS: list[tuple[str, Callable[[Path], None], str]] = [
    ("another format version", lambda f: _rewrite_manifest(
        f, lambda m: m.update(format="trellis-prepared/2")),
     r"manifest.json: format 'trellis-prepared/2' is not 'trellis-prepared/1'"),
    ("a manifest that is not JSON", lambda f: (f / MANIFEST).write_text("{nope"),
     "manifest.json: not a readable JSON manifest"),
    ("no graphs.npz", lambda f: (f / GRAPHS).unlink(), "graphs.npz: missing"),
    ("a truncated graphs.npz", lambda f: (f / GRAPHS).write_bytes((f / GRAPHS).read_bytes()[:60]),
     "graphs.npz: cannot be read"),
    ("a pickled array", lambda f: _rewrite_arrays(
        f, lambda a: a.update(origin=np.array([object()] * 8, dtype=object))),
     "graphs.npz: cannot be read"),
    ("more graphs than the manifest says", lambda f: _rewrite_manifest(
        f, lambda m: m["counts"].update(graphs=9)),
     "graphs.npz: holds 8 graphs, but its manifest says 9"),
    ("an edge across graphs", lambda f: _rewrite_arrays(
        f, lambda a: a["edge_index"].__setitem__((1, 0), 20)),
     "graphs.npz: an edge joins nodes outside its own graph"),
    ("features of another width", lambda f: _rewrite_manifest(
        f, lambda m: m["stats"].update(node_features=5)),
     "graphs.npz: x has 3 features per node, but its manifest says 5"),
    ("features stored as float64", lambda f: _rewrite_arrays(
        f, lambda a: a.update(x=a["x"].astype(np.float64))),
     "graphs.npz: x must be float32"),
    ("no labels", lambda f: _rewrite_arrays(f, lambda a: a.pop("y")),
     "graphs.npz: the array y is missing"),
    ("labels that do not match the class counts", lambda f: _rewrite_arrays(
        f, lambda a: a.update(y=np.zeros(8, np.int64))),
     "graphs.npz: the graphs' labels do not match the class counts"),
    ("a split the manifest does not have", lambda f: _rewrite_arrays(
        f, lambda a: a.update(split_train=np.arange(6))),
     "graphs.npz: holds split arrays, but its manifest has no split"),
]


@pytest.mark.parametrize(("spoil", "message"), [c[1:] for c in CORRUPTIONS],
                         ids=[c[0] for c in CORRUPTIONS])
def test_a_corrupt_folder_is_refused_in_one_line_naming_the_file(
        tmp_path: Path, spoil: Callable[[Path], None], message: str) -> None:
    folder = _good_folder(tmp_path)
    spoil(folder)
    with pytest.raises(DataFormatError, match=message) as caught:
        load_graph_folder(folder)
    assert "\n" not in str(caught.value)
    assert str(folder) in str(caught.value)


def _small_hetero() -> HeteroGraph:
    edges = {("paper", "cites", "paper"): np.array([[0, 1, 2, 3], [1, 2, 3, 0]]),
             ("paper", "by", "author"): np.array([[0, 1, 2, 3], [0, 0, 1, 1]])}
    return HeteroGraph(("paper", "author"), {"paper": 4, "author": 2}, tuple(edges), edges,
                       "paper", 2, np.array([0, 1, 0, -1]), np.array([0, 1]), np.array([2]),
                       np.array([], np.int64))


def test_a_heterogeneous_graph_is_written_with_its_manifest(tmp_path: Path) -> None:
    source = tmp_path / "g.nt"
    source.write_text("<a> <b> <c> .\n")
    refused = [Refusal("g.nt", "http://x/e7", "no label")]
    out = write_prepared_hetero(_small_hetero(), refused, Featuriser("rdf-types", "1", {}),
                                [source], tmp_path / "out", name="g", strict=False, now=NOW)
    graph = load_hetero_folder(out)
    assert graph.num_nodes == {"paper": 4, "author": 2} and graph.labels.tolist() == [0, 1, 0, -1]
    manifest = read_manifest(out)
    assert (manifest["task"], manifest["name"]) == ("node", "g")
    assert manifest["counts"] == {"graphs": 1, "classes": {"0": 2, "1": 1}, "refused": 1}
    assert manifest["stats"]["node_types"] == {"paper": 4, "author": 2}
    assert manifest["split"] == {"kind": "given", "train": 2, "val": 1, "test": 0}
    with pytest.raises(DataFormatError, match="a heterogeneous graph"):
        load_prepared(out)
    with pytest.raises(RowsRefused):
        write_prepared_hetero(_small_hetero(), refused, Featuriser("rdf-types", "1", {}),
                              [source], tmp_path / "strict", name="g", strict=True)
    assert not (tmp_path / "strict").exists()



def test_a_split_that_names_a_graph_twice_is_refused_before_writing(tmp_path: Path) -> None:
    split = {"train": np.array([0, 1, 2, 3, 4]), "val": np.array([5, 5]), "test": np.array([7])}
    prep = Preparation(rings(8), [], FEATURISER, [], "rings", split=split, split_kind="scaffold")
    with pytest.raises(DataFormatError, match="split_val names a graph twice"):
        write_prepared(prep, tmp_path / "out", strict=False)
    assert _listing(tmp_path) == []
