"""What `silo data inspect` reports of a prepared folder (silo/data/prepared/inspect.py): the
split training will use, duplicates, and refusals of what an algorithm cannot use."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.support.prepared_sources import FEATURISER, ring, rings
from trellis.silo.data.hetero import HeteroGraph
from trellis.silo.data.prepared import tu_source
from trellis.silo.data.prepared.folder import write_prepared, write_prepared_hetero
from trellis.silo.data.prepared.inspect import inspect_prepared
from trellis.silo.data.prepared.model import Featuriser, Preparation, Refusal, SourceOptions
from trellis.silo.data.split import stratified_split
from trellis.silo.data.synthetic import write_tu_folder


def _write(tmp_path: Path, prep: Preparation) -> Path:
    return write_prepared(prep, tmp_path / "out", strict=False)


def test_a_usable_folder_reports_what_training_will_see(tmp_path: Path) -> None:
    folder = write_tu_folder(tmp_path / "tu", "MOL", "molecules", 40, seed=2)
    prep = tu_source.read(folder, SourceOptions())
    report = inspect_prepared(_write(tmp_path, prep))
    labels = np.array([g.label for g in prep.graphs])
    expected = stratified_split(np.unique(labels, return_inverse=True)[1])
    assert report.graphs == 40 and report.task == "graph" and report.name == "MOL"
    assert report.classes == {str(v): int((labels == v).sum()) for v in np.unique(labels)}
    assert report.split == {"train": expected.train.size, "val": expected.val.size,
                            "test": expected.test.size}
    assert report.split_kind == "stratified 80/10/10, as training makes it"
    assert (report.node_features, report.edge_features) == (prep.graphs[0].x.shape[1], 0)
    assert report.featuriser["name"] == "tu-one-hot"
    assert report.duplicates == 0 and report.problems == []
    assert report.to_json()["classes"] == report.classes


def test_duplicates_are_counted_by_their_arrays_or_their_keys(tmp_path: Path) -> None:
    graphs = rings(8)
    graphs += [ring(0, nodes=3, origin="rings.txt:9"), ring(1, nodes=3, origin="rings.txt:10"),
               ring(0, nodes=5, origin="rings.txt:11")]
    report = inspect_prepared(_write(tmp_path, Preparation(graphs, [], FEATURISER, [], "r")))
    assert report.duplicates == 3
    assert report.duplicate_groups == [["rings.txt:1", "rings.txt:9", "rings.txt:10"],
                                       ["rings.txt:3", "rings.txt:11"]]
    assert report.conflicting_duplicates == 1       # rings.txt:10 has another label
    keyed = rings(8)
    for graph in keyed:
        graph.key = "CCO" if graph.origin in ("rings.txt:2", "rings.txt:6") else graph.origin
    report = inspect_prepared(write_prepared(Preparation(keyed, [], FEATURISER, [], "k"),
                                             tmp_path / "keyed", strict=False))
    assert (report.duplicates, report.duplicate_groups) == (1, [["rings.txt:2", "rings.txt:6"]])


def test_too_few_graphs_for_the_split_is_refused_with_the_counts(tmp_path: Path) -> None:
    refused = [Refusal("m.csv", "4", "no label")]
    report = inspect_prepared(_write(tmp_path, Preparation(rings(4), refused, FEATURISER, [],
                                                           "tiny")))
    assert len(report.problems) == 1
    assert "4 graphs (class 0: 2, class 1: 2) split into" in report.problems[0]
    assert "a silo needs at least 6 graphs" in report.problems[0]
    assert report.refused == [{"source": "m.csv", "row": "4", "reason": "no label"}]


def test_a_single_class_is_refused(tmp_path: Path) -> None:
    graphs = [ring(1, nodes=3 + i, origin=f"r:{i}") for i in range(10)]
    report = inspect_prepared(_write(tmp_path, Preparation(graphs, [], FEATURISER, [], "one")))
    assert report.problems == [f"{tmp_path / 'out'}: every graph has the label 1; a classifier "
                               "needs at least two classes"]


def test_the_folder_s_own_split_is_the_one_reported_and_checked(tmp_path: Path) -> None:
    split = {"train": np.array([0, 2, 4, 6]), "val": np.array([1, 3]), "test": np.array([5, 7])}
    prep = Preparation(rings(8), [], FEATURISER, [], "r", split=split, split_kind="scaffold")
    report = inspect_prepared(_write(tmp_path, prep))
    assert report.split == {"train": 4, "val": 2, "test": 2}
    assert report.split_kind == "the folder's own (scaffold)"
    assert len(report.problems) == 1
    assert "classes [1] would have no training graph" in report.problems[0]


def test_a_heterogeneous_graph_reports_its_labelled_nodes(tmp_path: Path) -> None:
    edges = {("paper", "cites", "paper"): np.array([[0, 1, 2], [1, 2, 0]])}
    graph = HeteroGraph(("paper",), {"paper": 3}, tuple(edges), edges, "paper", 2,
                        np.array([0, 1, 1]), np.array([0, 1]), np.array([2]),
                        np.array([], np.int64))
    out = write_prepared_hetero(graph, [], Featuriser("rdf", "1", {}), [], tmp_path / "kg",
                                name="kg", strict=False)
    report = inspect_prepared(out)
    assert (report.task, report.graphs, report.classes) == ("node", 1, {"0": 1, "1": 2})
    assert report.problems == [f"{out}: the test split is empty "
                               "({'train': 2, 'val': 1, 'test': 0})"]
