"""Tests for the TU-format loader: real datasets, PyG semantics and malformed folders."""

from __future__ import annotations

import gzip
import re
from functools import cache
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trellis.silo.data.tu as tu
from tests.paths import TU_ROOT
from trellis.silo.data.tu import DataFormatError, GraphDataset, find_tu_prefix, load_tu_folder


@cache
def _real(name: str) -> GraphDataset:
    if not (TU_ROOT / name).is_dir():
        pytest.skip(f"shared TU data not available: {TU_ROOT / name}")
    return load_tu_folder(TU_ROOT / name)


def _edge_set(edge_index: torch.Tensor) -> set[tuple[int, int]]:
    return set(map(tuple, edge_index.t().tolist()))


# --- real datasets -----------------------------------------------------------------------


def test_mutag() -> None:
    ds = _real("MUTAG")
    assert ds.name == "MUTAG"
    assert len(ds.graphs) == 188
    assert ds.num_classes == 2 and ds.num_features == 7 and ds.feature_kind == "node_labels"
    assert sum(g.num_nodes for g in ds.graphs) == 3371
    assert {int(g.y) for g in ds.graphs} == {0, 1}
    # MUTAG labels are -1 (63 graphs) and 1 (125 graphs), remapped in sorted order.
    assert sum(int(g.y) for g in ds.graphs) == 125
    for g in ds.graphs:
        assert g.x.dtype == torch.float32 and g.x.shape == (g.num_nodes, 7)
        assert torch.equal(g.x.sum(dim=1), torch.ones(g.num_nodes))
        assert g.edge_index.dtype == torch.int64 and g.y.dtype == torch.int64
        assert g.y.shape == (1,)
        src, dst = g.edge_index
        assert not torch.any(src == dst)
        assert int(g.edge_index.max()) < g.num_nodes
        keys = src * g.num_nodes + dst
        assert torch.all(keys[1:] > keys[:-1])  # coalesced: sorted, no duplicates
        assert _edge_set(g.edge_index) == _edge_set(g.edge_index.flip(0))


def test_imdb_binary_duplicates_are_coalesced() -> None:
    ds = _real("IMDB-BINARY")
    assert len(ds.graphs) == 1000 and ds.num_classes == 2
    # The file lists every edge twice; without coalescing the maximum degree would be 270.
    assert ds.feature_kind == "degree" and ds.num_features == 136
    assert sum(g.edge_index.size(1) for g in ds.graphs) == 193062
    for g in ds.graphs:
        keys = g.edge_index[0] * g.num_nodes + g.edge_index[1]
        assert torch.all(keys[1:] > keys[:-1])
        degree = torch.bincount(g.edge_index[0], minlength=g.num_nodes)
        assert torch.equal(g.x.argmax(dim=1), degree)


def test_letter_low_uses_attributes() -> None:
    ds = _real("Letter-low")
    assert len(ds.graphs) == 2250 and ds.num_classes == 15
    assert ds.feature_kind == "node_attributes" and ds.num_features == 2
    assert ds.graphs[0].x.dtype == torch.float32
    # Letter-low has isolated nodes: every node still has a feature row.
    assert sum(g.num_nodes for g in ds.graphs) == 10522


@pytest.mark.parametrize(
    ("name", "width", "graphs"),
    [
        ("ENZYMES", 3, 600),
        ("BZR", 53, 405),
        ("COX2", 35, 467),
        ("DHFR", 53, 756),
        ("PTC_MR", 18, 344),
        ("AIDS", 38, 2000),
        ("NCI1", 37, 4110),
        ("PROTEINS", 3, 1113),
    ],
)
def test_node_label_widths(name: str, width: int, graphs: int) -> None:
    ds = _real(name)
    assert ds.feature_kind == "node_labels"
    assert ds.num_features == width and len(ds.graphs) == graphs
    assert all(g.x.shape[1] == width for g in ds.graphs)


def test_forced_features_on_real_data() -> None:
    if not (TU_ROOT / "ENZYMES").is_dir():
        pytest.skip("shared TU data not available")
    enzymes = load_tu_folder(TU_ROOT / "ENZYMES", features="node_attributes")
    assert enzymes.num_features == 18 and enzymes.feature_kind == "node_attributes"
    degree = load_tu_folder(TU_ROOT / "MUTAG", features="degree", max_degree=2)
    assert degree.num_features == 3
    g = degree.graphs[0]
    expected = torch.bincount(g.edge_index[0], minlength=g.num_nodes).clamp(max=2)
    assert torch.equal(g.x.argmax(dim=1), expected)
    with pytest.raises(DataFormatError, match="node_attributes"):
        load_tu_folder(TU_ROOT / "MUTAG", features="node_attributes")


# --- small hand-written folders -------------------------------------------------------------

# Two graphs: graph 1 = nodes 1-3 (a path 1-2-3 plus a self loop and a duplicate line),
# graph 2 = nodes 4-5 (one edge). Labels -1 / 1; node labels 2..4 (width 3 after the shift).
GOOD = {
    "A": "1, 2\n2, 1\n2, 3\n3, 2\n2, 2\n1, 2\n4, 5\n5, 4\n",
    "graph_indicator": "1\n1\n1\n2\n2\n",
    "graph_labels": "1\n-1\n",
    "node_labels": "2\n3\n4\n2\n2\n",
}


def _write(folder: Path, files: dict[str, str], *, gz: bool, prefix: str = "TOY") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for part, text in files.items():
        data = text.encode()
        suffix = ".txt.gz" if gz else ".txt"
        (folder / f"{prefix}_{part}{suffix}").write_bytes(gzip.compress(data) if gz else data)
    return folder


@pytest.fixture(params=[False, True], ids=["plain", "gz"])
def gz(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def _error(tmp_path: Path, gz: bool, **changes: str | None) -> str:
    files = {k: v for k, v in {**GOOD, **changes}.items() if v is not None}
    with pytest.raises(DataFormatError) as info:
        load_tu_folder(_write(tmp_path / "ds", files, gz=gz))
    return str(info.value)


def test_toy_semantics(tmp_path: Path, gz: bool) -> None:
    ds = load_tu_folder(_write(tmp_path / "ds", GOOD, gz=gz))
    assert find_tu_prefix(tmp_path / "ds") == "TOY"
    assert ds.num_classes == 2 and ds.num_features == 3
    first, second = ds.graphs
    assert first.num_nodes == 3 and second.num_nodes == 2
    assert first.edge_index.tolist() == [[0, 1, 1, 2], [1, 0, 2, 1]]
    assert second.edge_index.tolist() == [[0, 1], [1, 0]]
    assert int(first.y) == 1 and int(second.y) == 0
    assert first.x.tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]


def test_degree_features_and_clamp(tmp_path: Path) -> None:
    files = {k: v for k, v in GOOD.items() if k != "node_labels"}
    folder = _write(tmp_path / "ds", files, gz=False)
    ds = load_tu_folder(folder)
    assert ds.feature_kind == "degree" and ds.num_features == 3  # max degree 2 (middle node)
    assert ds.graphs[0].x.argmax(dim=1).tolist() == [1, 2, 1]
    clamped = load_tu_folder(folder, max_degree=1)
    assert clamped.num_features == 2
    assert clamped.graphs[0].x.argmax(dim=1).tolist() == [1, 1, 1]
    with pytest.raises(DataFormatError, match="node_labels"):
        load_tu_folder(folder, features="node_labels")


def test_multi_column_labels_and_attributes(tmp_path: Path) -> None:
    files = {
        **GOOD,
        "node_labels": "0, 5\n1, 5\n0, 7\n1, 6\n0, 5\n",
        "node_attributes": "0.5, -1\n1e-3, 2.\n.25, 3\n4, 5\n-6.5, 7E1\n",
    }
    folder = _write(tmp_path / "ds", files, gz=False)
    labels = load_tu_folder(folder)
    # Column 1 spans 0..1 (width 2), column 2 spans 5..7 (width 3).
    assert labels.num_features == 5
    assert labels.graphs[0].x.tolist() == [[1, 0, 1, 0, 0], [0, 1, 1, 0, 0], [1, 0, 0, 0, 1]]
    attrs = load_tu_folder(folder, features="node_attributes")
    assert attrs.num_features == 2
    assert attrs.graphs[1].x.tolist() == [[4.0, 5.0], [-6.5, 70.0]]


def test_unsorted_graph_indicator(tmp_path: Path) -> None:
    # Nodes 1..4 interleave two graphs: graph 1 = {1, 3}, graph 2 = {2, 4}.
    files = {
        "A": "1, 3\n3, 1\n2, 4\n4, 2\n",
        "graph_indicator": "1\n2\n1\n2\n",
        "graph_labels": "0\n1\n",
        "node_labels": "0\n1\n2\n3\n",
    }
    ds = load_tu_folder(_write(tmp_path / "ds", files, gz=False))
    assert [g.x.argmax(dim=1).tolist() for g in ds.graphs] == [[0, 2], [1, 3]]
    assert all(g.edge_index.tolist() == [[0, 1], [1, 0]] for g in ds.graphs)


def test_windows_line_ends_and_trailing_blank_lines(tmp_path: Path) -> None:
    files = {k: v.replace("\n", "\r\n") + "\r\n\n" for k, v in GOOD.items()}
    ds = load_tu_folder(_write(tmp_path / "ds", files, gz=False))
    assert len(ds.graphs) == 2 and ds.graphs[0].edge_index.size(1) == 4


def test_small_chunks_parse_the_same_and_count_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _write(tmp_path / "ds", GOOD, gz=False)
    whole = load_tu_folder(folder)
    monkeypatch.setattr(tu, "_CHUNK_BYTES", 3)
    chunked = load_tu_folder(folder)
    for a, b in zip(whole.graphs, chunked.graphs, strict=True):
        assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.x, b.x)
    broken = GOOD["A"].split("\n")
    broken[5] = "1; 2"
    message = _error(tmp_path / "bad", False, A="\n".join(broken))
    assert "TOY_A.txt line 6:" in message and "'1; 2'" in message


# --- malformed folders ----------------------------------------------------------------------


def test_non_numeric_token_names_file_and_line(tmp_path: Path, gz: bool) -> None:
    message = _error(tmp_path, gz, A="1, 2\n2, 1\n3, x\n")
    name = "TOY_A.txt.gz" if gz else "TOY_A.txt"
    assert message == f"{name} line 3: expected two comma-separated node ids, got '3, x'"


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("1, 2\n2 1\n", 2),  # no comma
        ("1, 2\n2, 1, 3\n", 2),  # three ids
        ("1, 2\n\n2, 1\n", 2),  # blank line inside the file
        ("1, 2\n2, -\n", 2),  # a sign alone
        ("1, 2\n2, 1-3\n", 2),  # a sign inside a number
        ("1, 2\n2, 1\n2, 3\n1.5, 2\n", 4),  # not an integer
    ],
)
def test_malformed_adjacency_lines(tmp_path: Path, text: str, line: int) -> None:
    assert f"TOY_A.txt line {line}: expected two comma-separated node ids" in _error(
        tmp_path, False, A=text
    )


def test_node_id_out_of_range(tmp_path: Path, gz: bool) -> None:
    message = _error(tmp_path, gz, A="1, 2\n2, 1\n4, 6\n")
    assert "line 3: node id out of range 1..5" in message and "'4, 6'" in message
    assert "line 1: node id out of range" in _error(tmp_path / "zero", gz, A="0, 1\n")


def test_missing_graph_labels(tmp_path: Path, gz: bool) -> None:
    message = _error(tmp_path, gz, graph_labels=None)
    assert "missing required file TOY_graph_labels.txt" in message


def test_indicator_and_labels_disagree(tmp_path: Path, gz: bool) -> None:
    too_few = _error(tmp_path / "a", gz, graph_labels="1\n")
    assert "graph_indicator" in too_few and "line 4: graph id 2 is outside 1..1" in too_few
    too_many = _error(tmp_path / "b", gz, graph_labels="1\n-1\n1\n")
    assert "graph 3 has no nodes" in too_many


def test_node_labels_wrong_line_count(tmp_path: Path, gz: bool) -> None:
    message = _error(tmp_path, gz, node_labels="1\n2\n3\n")
    assert "TOY_node_labels.txt" in message and "3 lines" in message and "5 nodes" in message


def test_edge_between_graphs(tmp_path: Path, gz: bool) -> None:
    message = _error(tmp_path, gz, A="1, 2\n2, 1\n3, 4\n")
    assert "line 3: edge '3, 4' joins graph 1 and graph 2" in message


def test_empty_file(tmp_path: Path, gz: bool) -> None:
    assert "TOY_graph_labels.txt" in _error(tmp_path, gz, graph_labels="")
    assert "file is empty" in _error(tmp_path / "b", gz, graph_labels="\n \n")


def test_folder_problems(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataFormatError, match="no TU dataset"):
        load_tu_folder(tmp_path / "empty")
    with pytest.raises(DataFormatError, match="no such folder"):
        load_tu_folder(tmp_path / "missing")
    _write(tmp_path / "two", GOOD, gz=False, prefix="ONE")
    _write(tmp_path / "two", GOOD, gz=False, prefix="TWO")
    with pytest.raises(DataFormatError, match="several TU datasets"):
        find_tu_prefix(tmp_path / "two")
    _write(tmp_path / "both", GOOD, gz=False)
    _write(tmp_path / "both", {"A": GOOD["A"]}, gz=True)
    with pytest.raises(DataFormatError, match="both TOY_A.txt and TOY_A.txt.gz"):
        load_tu_folder(tmp_path / "both")
    (tmp_path / "corrupt").mkdir()
    for part, text in GOOD.items():
        (tmp_path / "corrupt" / f"TOY_{part}.txt.gz").write_bytes(text.encode())
    with pytest.raises(DataFormatError, match="cannot be read"):
        load_tu_folder(tmp_path / "corrupt")


def test_bad_arguments(tmp_path: Path) -> None:
    folder = _write(tmp_path / "ds", GOOD, gz=False)
    with pytest.raises(ValueError, match="features must be one of"):
        load_tu_folder(folder, features="labels")
    with pytest.raises(ValueError, match="max_degree"):
        load_tu_folder(folder, max_degree=-1)


# --- the fast parser agrees with a line-by-line reading -------------------------------------

_LINE = re.compile(rb"[ \t\r]*[+-]?\d+[ \t\r]*,[ \t\r]*[+-]?\d+[ \t\r]*")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pairs=st.lists(st.tuples(st.integers(-99, 10**6), st.integers(-99, 10**6)), min_size=1),
    junk=st.text(alphabet="0123456789+-., \t\rx", max_size=8),
    where=st.integers(min_value=0),
    chunk=st.integers(min_value=1, max_value=40),
)
def test_fast_parser_matches_line_by_line(
    tmp_path_factory: pytest.TempPathFactory,
    pairs: list[tuple[int, int]],
    junk: str,
    where: int,
    chunk: int,
) -> None:
    lines = [f"{a}, {b}".encode() for a, b in pairs]
    where %= len(lines) + 1
    lines.insert(where, junk.encode())
    path = tmp_path_factory.mktemp("parse") / "P_A.txt"
    path.write_bytes(b"\n".join(lines) + b"\n")
    # The reference: every line (trailing blank lines aside) is "int, int" up to blanks.
    while lines and not lines[-1].strip():
        lines.pop()
    bad = [i for i, line in enumerate(lines, start=1) if not _LINE.fullmatch(line)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tu, "_CHUNK_BYTES", chunk)
        if not lines:
            with pytest.raises(DataFormatError, match="file is empty"):
                tu._read_table(path, 2, int, "node id")
        elif bad:
            with pytest.raises(DataFormatError, match=f"^P_A.txt line {bad[0]}: "):
                tu._read_table(path, 2, int, "node id")
        else:
            expected = [[int(v) for v in line.split(b",")] for line in lines]
            assert tu._read_table(path, 2, int, "node id").tolist() == expected
