"""The PyG source: lists of Data saved with torch.save, and files that would run code."""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

from trellis.silo.data.graph_sources import pyg
from trellis.silo.data.prepared.model import SourceOptions
from trellis.silo.data.tu import DataFormatError


def _triangle(label: int, **extra: torch.Tensor) -> Data:
    edge_index = torch.tensor([[0, 1, 1, 2, 2, 0], [1, 0, 2, 1, 0, 2]])
    fields = {"x": torch.eye(3), "edge_index": edge_index, "y": torch.tensor([label]), **extra}
    return Data(**fields)


def test_a_list_of_data_is_read_as_given(tmp_path: Path) -> None:
    path = tmp_path / "graphs.pt"
    path_graph = Data(x=torch.ones(2, 3), edge_index=torch.tensor([[0], [1]]),
                      y=torch.tensor(0), edge_attr=torch.tensor([[2.0, 3.0]]))
    torch.save([_triangle(1, edge_attr=torch.ones(6, 2)), path_graph], path)
    prep = pyg.read(path, SourceOptions())
    assert prep.name == "graphs" and prep.featuriser.name == "pyg-as-given"
    assert [g.label for g in prep.graphs] == [1, 0]
    assert prep.graphs[0].x.tolist() == torch.eye(3).tolist()
    assert prep.graphs[0].edge_index.shape == (2, 6)
    # the one-direction edge of the second graph gets its reverse, attributes copied
    assert prep.graphs[1].edge_index.tolist() == [[0, 1], [1, 0]]
    assert prep.graphs[1].edge_attr is not None
    assert prep.graphs[1].edge_attr.tolist() == [[2.0, 3.0], [2.0, 3.0]]
    assert prep.graphs[1].origin == "graphs.pt:[1]"
    assert prep.refused == [] and prep.sources == [path]


def test_bad_graphs_are_refused_one_by_one(tmp_path: Path) -> None:
    path = tmp_path / "graphs.pt"
    torch.save([_triangle(0), _triangle(1, y=torch.tensor([0.5])),
                Data(x=torch.ones(2, 3), edge_index=torch.tensor([[0], [5]]), y=torch.tensor(1)),
                Data(x=torch.ones(2, 4), edge_index=torch.tensor([[0], [1]]), y=torch.tensor(1)),
                Data(x=torch.ones(2, 3), edge_index=torch.tensor([[0], [1]])),
                {"x": torch.ones(1, 3), "edge_index": torch.zeros(2, 0, dtype=torch.long),
                 "y": torch.tensor(2)}], path)
    prep = pyg.read(path, SourceOptions())
    assert [g.label for g in prep.graphs] == [0, 2]
    reasons = {r.row: r.reason for r in prep.refused}
    assert reasons == {"[1]": "y is 0.5, not an integer class",
                       "[2]": "edge_index names node 5 but the graph has 2 nodes",
                       "[3]": "x has 4 columns where the first graph's has 3",
                       "[4]": "no y (the graph's label)"}


def test_graphs_without_x_get_a_constant_feature(tmp_path: Path) -> None:
    path = tmp_path / "plain.pt"
    torch.save([Data(edge_index=torch.tensor([[0, 1], [1, 0]]), y=torch.tensor([3]),
                     num_nodes=3)], path)
    prep = pyg.read(path, SourceOptions())
    assert prep.graphs[0].x.tolist() == [[1.0], [1.0], [1.0]]
    assert prep.featuriser.settings == {"node_features": "constant"}
    assert "constant feature" in prep.notes[0]


def test_a_multi_task_y_takes_the_task_index(tmp_path: Path) -> None:
    path = tmp_path / "tox.pt"
    torch.save([_triangle(0, y=torch.tensor([[0.0, 1.0, float("nan")]]))], path)
    assert pyg.read(path, SourceOptions()).refused[0].reason.startswith("y has 3 values")
    assert pyg.read(path, SourceOptions(label_column="1")).graphs[0].label == 1
    assert "not an integer" in pyg.read(path, SourceOptions(label_column="2")).refused[0].reason


class _RunsCode:
    """Unpickling this calls os.system: what a hostile file does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _torch_style_zip(path: Path, payload: bytes) -> None:
    """A zip laid out as torch.save writes one, around a pickle we wrote ourselves."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", payload)
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3\n")
    path.write_bytes(buffer.getvalue())


def test_a_file_that_would_run_code_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    hostile = tmp_path / "hostile.pt"
    _torch_style_zip(hostile, pickle.dumps([_RunsCode(marker)], protocol=2))
    with pytest.raises(DataFormatError) as caught:
        pyg.read(hostile, SourceOptions())
    message = str(caught.value)
    assert message.startswith("hostile.pt: refused: the file would run code when loaded (")
    assert "system" in message and message.endswith("save plain tensors/Data only")
    assert "\n" not in message
    raw = tmp_path / "raw.pkl"
    raw.write_bytes(pickle.dumps([_RunsCode(marker)]))
    with pytest.raises(DataFormatError, match="refused: the file would run code"):
        pyg.read(raw, SourceOptions())
    saved = tmp_path / "saved.pt"
    torch.save([_RunsCode(marker)], saved)
    with pytest.raises(DataFormatError, match="refused: the file would run code"):
        pyg.read(saved, SourceOptions())
    assert not marker.exists()


def test_files_that_are_not_a_list_of_graphs(tmp_path: Path) -> None:
    text = tmp_path / "notes.pt"
    text.write_text("hello")
    with pytest.raises(DataFormatError, match=r"^notes.pt: not a file torch.save wrote"):
        pyg.read(text, SourceOptions())
    single = tmp_path / "single.pt"
    torch.save(_triangle(0), single)
    with pytest.raises(DataFormatError, match="holds a Data, not a list of graphs"):
        pyg.read(single, SourceOptions())
    empty = tmp_path / "empty.pt"
    torch.save([], empty)
    with pytest.raises(DataFormatError, match="the list of graphs is empty"):
        pyg.read(empty, SourceOptions())
