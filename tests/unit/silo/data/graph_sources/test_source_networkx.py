"""The NetworkX source: GraphML, GML, GEXF and node-link JSON files the test writes."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest

from trellis.silo.data.graph_sources import networkx_files
from trellis.silo.data.prepared.model import SourceOptions
from trellis.silo.data.tu import DataFormatError


def _molecule(label: int, atoms: list[str]) -> nx.Graph:
    """A path of atoms with categorical node labels and the graph's label."""
    graph = nx.Graph(label=label)
    for index, atom in enumerate(atoms):
        graph.add_node(f"n{index}", label=atom)
    graph.add_edges_from((f"n{i}", f"n{i + 1}") for i in range(len(atoms) - 1))
    return graph


def test_a_folder_of_each_format_gives_one_hot_node_labels(tmp_path: Path) -> None:
    folder = tmp_path / "mols"
    folder.mkdir()
    nx.write_graphml(_molecule(1, ["C", "O"]), folder / "a.graphml")
    nx.write_gexf(_molecule(0, ["N", "C", "C"]), folder / "b.gexf")
    (folder / "c.json").write_text(json.dumps(nx.node_link_data(_molecule(1, ["O"]))))
    (folder / "d.gml").write_text('graph [\n  label 0\n  node [ id 0 label "C" ]\n'
                                  '  node [ id 1 label "N" ]\n  edge [ source 0 target 1 ]\n]\n')
    (folder / "notes.txt").write_text("not a graph")
    labels = tmp_path / "labels.csv"
    labels.write_text("name,label\nb.gexf,0\n")   # GEXF holds no graph attributes
    prep = networkx_files.read(folder, SourceOptions(labels=labels))
    assert prep.refused == []
    assert [g.origin for g in prep.graphs] == ["a.graphml", "b.gexf", "c.json", "d.gml"]
    assert [g.label for g in prep.graphs] == [1, 0, 1, 0]
    assert prep.featuriser.name == "networkx"
    assert prep.featuriser.settings["label_values"] == ["C", "N", "O"]
    first = prep.graphs[0]
    assert first.x.tolist() == [[1, 0, 0], [0, 0, 1]]
    assert first.edge_index.tolist() == [[0, 1], [1, 0]]
    assert prep.graphs[1].edge_index.shape == (2, 4)
    assert prep.name == "mols" and len(prep.sources) == 5


def test_numeric_x_and_edge_x_from_lists_and_text(tmp_path: Path) -> None:
    graph = nx.DiGraph(label="2")
    graph.add_node(0, x="0.5 1")
    graph.add_node(1, x="[2, 3]")
    graph.add_edge(0, 1, x=1.5)
    path = tmp_path / "g.graphml"
    nx.write_graphml(graph, path)
    prep = networkx_files.read(path, SourceOptions())
    only = prep.graphs[0]
    assert only.x.tolist() == [[0.5, 1.0], [2.0, 3.0]] and only.label == 2
    assert only.edge_index.tolist() == [[0, 1], [1, 0]]   # directed: the reverse is added
    assert only.edge_attr is not None and only.edge_attr.tolist() == [[1.5], [1.5]]
    assert prep.featuriser.settings["node_features"] == "x"
    assert prep.notes == ["added the reverse of 1 edges of directed graphs"]


def test_labels_from_a_csv_and_refusals_per_file(tmp_path: Path) -> None:
    folder = tmp_path / "graphs"
    folder.mkdir()
    for name in ("p", "q", "r"):
        plain = nx.path_graph(3)
        nx.write_gml(plain, folder / f"{name}.gml")
    (folder / "s.graphml").write_text("<graphml><graph>")
    labels = tmp_path / "labels.csv"
    labels.write_text("file,activity\np.gml,1\nq,0\nr.gml,high\n")
    prep = networkx_files.read(folder, SourceOptions(labels=labels, label_column="activity"))
    assert [g.label for g in prep.graphs] == [1, 0]
    assert prep.featuriser.settings["node_features"] == "label"   # GML's names: 0, 1, 2
    reasons = {r.source: r.reason for r in prep.refused}
    assert reasons == {"r.gml": "the label 'high' is not an integer class",
                       "s.graphml": "line 1: not well-formed GraphML (column 16)"}
    assert labels in prep.sources


def test_mistakes_give_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": [')
    with pytest.raises(DataFormatError, match=r"^bad.json: line 1: not JSON"):
        networkx_files.read(bad, SourceOptions())
    other = tmp_path / "g.txt"
    other.write_text("1 2\n")
    with pytest.raises(DataFormatError, match="g.txt: not a NetworkX file"):
        networkx_files.read(other, SourceOptions())
    unlabelled = tmp_path / "u.graphml"
    nx.write_graphml(nx.path_graph(2), unlabelled)
    prep = networkx_files.read(unlabelled, SourceOptions())
    assert prep.graphs == [] and prep.refused[0].reason == (
        "no graph attribute 'label' (the graph's label)")
    labels = tmp_path / "labels.csv"
    labels.write_text("file,y\nu,1\n")
    with pytest.raises(DataFormatError, match="labels.csv: line 1: no column 'label'"):
        networkx_files.read(unlabelled, SourceOptions(labels=labels))
