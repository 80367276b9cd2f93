"""GCFL's oneDS cut of one TU dataset into silos (docs/algorithms.md §3.2) and the split-tu
command."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from trellis.silo.cli.app import app
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.data.tu import load_tu_folder
from trellis.silo.data.tu_split import reference_chunks, write_oneds_split, write_tu_subsets


def _reference_loop(num_graphs: int, clients: int, seed: int) -> list[list[int]]:
    """`_randChunk(overlap=False)` as the reference writes it: global NumPy seed, one draw each."""
    np.random.seed(seed)
    min_size = min(50, int(num_graphs / clients))
    chunks = [list(range(i * min_size, (i + 1) * min_size)) for i in range(clients)]
    for g in range(clients * min_size, num_graphs):
        chunks[np.random.randint(low=0, high=clients, size=1)[0]].append(g)
    return chunks


@pytest.mark.parametrize(("num_graphs", "clients"), [(1113, 10), (4110, 30), (25, 2), (300, 7)])
def test_chunks_are_the_reference_chunks(num_graphs: int, clients: int) -> None:
    ours = reference_chunks(num_graphs, clients)
    assert [c.tolist() for c in ours] == _reference_loop(num_graphs, clients, 123)
    assert np.array_equal(np.sort(np.concatenate(ours)), np.arange(num_graphs))


def test_small_case_by_hand() -> None:
    """25 graphs, 2 silos: blocks 0-11 and 12-23, then graph 24 goes to one of them."""
    first, second = reference_chunks(25, 2)
    assert first[:12].tolist() == list(range(12)) and second[:12].tolist() == list(range(12, 24))
    assert first.size + second.size == 25 and 24 in set(first) | set(second)


def test_chunks_refuse_impossible_cuts() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        reference_chunks(100, 1)
    with pytest.raises(ValueError, match="cannot give 11 silos at least 10 graphs"):
        reference_chunks(100, 11)


def test_written_silos_hold_exactly_their_graphs(tmp_path: Path) -> None:
    source = write_tu_folder(tmp_path / "src", "SYN", "molecules", 120, seed=3)
    # Node attributes too (Letter-style): float columns must survive the round trip exactly.
    full = load_tu_folder(source)
    num_nodes = sum(g.num_nodes for g in full.graphs)
    attributes = np.random.default_rng(0).normal(size=(num_nodes, 2)) / 3
    np.savetxt(source / "SYN_node_attributes.txt", attributes, fmt="%.17g", delimiter=", ")
    sizes = write_oneds_split(source, 4, tmp_path / "out")
    assert sum(sizes.values()) == 120
    parts = reference_chunks(120, 4)
    attributed = load_tu_folder(source, features="node_attributes")
    for i, part in enumerate(parts):
        silo = load_tu_folder(tmp_path / "out" / f"client-{i}")
        assert len(silo.graphs) == part.size == sizes[tmp_path / "out" / f"client-{i}"]
        silo_attr = load_tu_folder(tmp_path / "out" / f"client-{i}", features="node_attributes")
        for g, a, j in zip(silo.graphs, silo_attr.graphs, part.tolist(), strict=True):
            original = full.graphs[j]
            assert torch.equal(g.edge_index, original.edge_index)
            assert torch.equal(g.x, original.x) and g.y.item() == original.y.item()
            assert torch.equal(a.x, attributed.graphs[j].x)


def test_subsets_reject_bad_parts(tmp_path: Path) -> None:
    source = write_tu_folder(tmp_path / "src", "SYN", "molecules", 30, seed=1)
    for parts, message in (([np.array([0, 0, 1])], "names a graph twice"),
                           ([np.array([5, 30])], "outside 0..29"),
                           ([np.array([], dtype=np.int64)], "is empty")):
        with pytest.raises(ValueError, match=message):
            write_tu_subsets(source, parts, tmp_path / "out")
    assert not (tmp_path / "out").exists()     # nothing half-written


def test_split_tu_command(tmp_path: Path) -> None:
    runner = CliRunner()
    source = write_tu_folder(tmp_path / "src", "SYN", "social", 60, seed=2)
    result = runner.invoke(app, ["split-tu", "--input", str(source), "--clients", "3",
                                 "--out", str(tmp_path / "three")])
    assert result.exit_code == 0, result.output
    assert "graphs per silo: 20, 20, 20" in result.output
    again = runner.invoke(app, ["split-tu", "--input", str(source), "--clients", "3",
                                "--out", str(tmp_path / "three")])
    assert again.exit_code == 2 and "is not an empty folder" in again.output
    missing = runner.invoke(app, ["split-tu", "--input", str(tmp_path / "nope"), "--clients",
                                  "3", "--out", str(tmp_path / "x")])
    assert missing.exit_code == 2 and "no such folder" in missing.output
    (source / "SYN_graph_indicator.txt").write_text("1\n2\nx\n")
    broken = runner.invoke(app, ["split-tu", "--input", str(source), "--clients", "3",
                                 "--out", str(tmp_path / "y")])
    assert broken.exit_code == 2 and "SYN_graph_indicator.txt line 3" in broken.output
    assert not (tmp_path / "y").exists()
    crowded = runner.invoke(app, ["split-tu", "--input", str(tmp_path / "three" / "client-0"),
                                  "--clients", "3", "--out", str(tmp_path / "z")])
    assert crowded.exit_code == 2 and "cannot give 3 silos" in crowded.output

