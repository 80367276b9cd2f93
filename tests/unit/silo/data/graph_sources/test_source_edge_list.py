"""The edge-list source: an edge list, a graph indicator, graph and node labels as plain files."""

from __future__ import annotations

from pathlib import Path

import pytest

from trellis.silo.data.graph_sources import edge_list
from trellis.silo.data.prepared.model import SourceOptions
from trellis.silo.data.tu import DataFormatError


def _files(tmp_path: Path, edges: str, indicator: str = "1\n1\n1\n2\n2\n",
           graph_labels: str = "0\n1\n", node_labels: str | None = "3\n4\n3\n5\n3\n"
           ) -> tuple[Path, SourceOptions]:
    """Two graphs: a triangle on nodes 1-3 and an edge on nodes 4-5 (1-based)."""
    source = tmp_path / "bonds.txt"
    source.write_text(edges)
    (tmp_path / "which.txt").write_text(indicator)
    (tmp_path / "classes.txt").write_text(graph_labels)
    options = SourceOptions(graph_indicator=tmp_path / "which.txt",
                            graph_labels=tmp_path / "classes.txt")
    if node_labels is not None:
        (tmp_path / "atoms.txt").write_text(node_labels)
        options = SourceOptions(graph_indicator=tmp_path / "which.txt",
                                graph_labels=tmp_path / "classes.txt",
                                node_labels=tmp_path / "atoms.txt")
    return source, options


def test_a_one_based_whitespace_edge_list_with_node_labels(tmp_path: Path) -> None:
    source, options = _files(tmp_path, "# triangle\n1 2\n2\t3\n3 1\n\n4 5\n")
    prep = edge_list.read(source, options)
    assert [g.label for g in prep.graphs] == [0, 1]
    triangle, pair = prep.graphs
    assert triangle.x.tolist() == [[1, 0, 0], [0, 1, 0], [1, 0, 0]]
    assert pair.x.tolist() == [[0, 0, 1], [1, 0, 0]]
    assert sorted(map(tuple, triangle.edge_index.T.tolist())) == [
        (0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
    assert pair.edge_index.tolist() == [[0, 1], [1, 0]]
    assert prep.featuriser.settings == {"node_features": "node-labels-one-hot",
                                        "label_low": 3, "label_width": 3}
    assert pair.origin == "classes.txt:2" and prep.refused == []
    assert [p.name for p in prep.sources] == ["bonds.txt", "which.txt", "classes.txt",
                                              "atoms.txt"]


def test_a_zero_based_comma_list_with_both_directions_and_no_node_labels(tmp_path: Path) -> None:
    source, options = _files(tmp_path, "0,1\n1,0\n3,4\n4,3\n", indicator="0\n0\n0\n1\n1\n",
                             node_labels=None)
    prep = edge_list.read(source, options)
    assert prep.notes == ["no --node-labels: every node has the constant feature 1.0"]
    first, second = prep.graphs
    assert first.x.tolist() == [[1.0]] * 3 and first.edge_index.tolist() == [[0, 1], [1, 0]]
    assert second.edge_index.tolist() == [[0, 1], [1, 0]]


def test_bad_labels_refuse_their_graph(tmp_path: Path) -> None:
    source, options = _files(tmp_path, "1 2\n4 5\n", graph_labels="active\n1\n3\n",
                             node_labels="3\n4\n3\nC\n3\n")
    prep = edge_list.read(source, options)
    assert prep.graphs == []
    assert [(r.source, r.row, r.reason) for r in prep.refused] == [
        ("classes.txt", "1", "graph label 'active' is not an integer"),
        ("atoms.txt", "4", "node label 'C' is not an integer (its graph, line 2 of the graph "
                           "labels, is refused)"),
        ("classes.txt", "3", "graph 3 has no nodes in which.txt")]


@pytest.mark.parametrize(("edges", "kwargs", "message"), [
    ("1 2\n2 x\n", {}, r"^bonds.txt: line 2: 'x' is not an integer$"),
    ("1 2 3\n", {}, "bonds.txt: line 1: 3 values; an edge is two node numbers"),
    ("1 2\n3 6\n", {}, "bonds.txt: line 2: node 6, but the graph indicator lists 5 nodes"),
    ("1 2\n3 4\n", {}, "bonds.txt: line 2: the edge 3-4 joins two graphs"),
    ("1 2\n", {"indicator": "1\n1\n\n2\n2\n"}, "which.txt: line 3: empty line"),
    ("1 2\n", {"indicator": "1\n1\n1\n2\n3\n"}, "which.txt: line 5: graph 3, but classes.txt "
                                                "has 2 lines"),
    ("1 2\n", {"node_labels": "1\n2\n"}, "atoms.txt: 2 lines, but the graph indicator lists 5"),
])
def test_mistakes_name_the_file_and_line(tmp_path: Path, edges: str, kwargs: dict[str, str],
                                         message: str) -> None:
    source, options = _files(tmp_path, edges, **kwargs)
    with pytest.raises(DataFormatError, match=message):
        edge_list.read(source, options)


def test_the_label_files_are_required(tmp_path: Path) -> None:
    source = tmp_path / "edges.csv"
    source.write_text("1,2\n")
    with pytest.raises(DataFormatError, match="needs --graph-indicator"):
        edge_list.read(source, SourceOptions())


def test_mutag_as_an_edge_list_matches_the_tu_loader() -> None:
    folder = Path("/work/shared/data/tu/MUTAG")
    if not (folder / "MUTAG_A.txt.gz").is_file():
        pytest.skip("the TU data is not on this machine")
    from trellis.silo.data.tu import load_tu_folder

    options = SourceOptions(graph_indicator=folder / "MUTAG_graph_indicator.txt.gz",
                            graph_labels=folder / "MUTAG_graph_labels.txt.gz",
                            node_labels=folder / "MUTAG_node_labels.txt.gz")
    prep = edge_list.read(folder / "MUTAG_A.txt.gz", options)
    tu = load_tu_folder(folder, features="node_labels")
    assert len(prep.graphs) == len(tu.graphs) == 188 and prep.notes == []
    for ours, theirs in zip(prep.graphs, tu.graphs, strict=True):
        assert ours.x.tolist() == theirs.x.tolist()
        assert sorted(map(tuple, ours.edge_index.T.tolist())) == sorted(
            map(tuple, theirs.edge_index.T.tolist()))
    classes = sorted({g.label for g in prep.graphs})
    assert [classes.index(g.label) for g in prep.graphs] == [int(g.y) for g in tu.graphs]
