"""Heterogeneous graph folders and FedHGN's basis-decomposed RGCN (docs/algorithms.md §5.1-§5.4)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.paths import HETERO_ROOT
from trellis.silo.data.hetero import (
    HeteroFormatError,
    HeteroGraph,
    load_hetero_folder,
    save_hetero_folder,
)
from trellis.silo.models.hgn import BasisRGCN, alignment_loss, build_operators

AIFB = HETERO_ROOT / "aifb"


def mean_in(graph: HeteroGraph, h: dict[str, torch.Tensor], c: tuple[str, str, str]
            ) -> torch.Tensor:
    """Mean over in-neighbours under one canonical edge type, degree clamped to 1."""
    src, _, dst = c
    index = torch.from_numpy(graph.edges[c])
    out = torch.zeros(graph.num_nodes[dst], h[src].shape[1])
    out.index_add_(0, index[1], h[src][index[0]])
    degree = torch.bincount(index[1], minlength=graph.num_nodes[dst]).clamp(min=1)
    return out / degree[:, None]


def small_graph() -> HeteroGraph:
    """Two node types, three canonical edge types, two of them named 'cites'."""
    edges = {
        ("paper", "cites", "paper"): np.array([[0, 1, 2, 2], [1, 2, 0, 1]]),
        ("paper", "writtenBy", "author"): np.array([[0, 1, 2], [0, 0, 1]]),
        ("author", "cites", "paper"): np.array([[0, 1], [2, 2]]),
        ("author", "rev_writtenBy", "paper"): np.array([[0, 0, 1], [0, 1, 2]]),
    }
    return HeteroGraph(("paper", "author"), {"paper": 3, "author": 2}, tuple(edges), edges,
                       "paper", 2, np.array([0, 1, 1]), np.array([0]), np.array([1]),
                       np.array([2]))


def test_folder_round_trip_and_aifb_counts(tmp_path: Path) -> None:
    graph = small_graph()
    save_hetero_folder(graph, tmp_path / "g")
    loaded = load_hetero_folder(tmp_path / "g")
    assert loaded.edge_types == graph.edge_types and loaded.relations == (
        "cites", "rev_writtenBy", "writtenBy")
    assert all(np.array_equal(loaded.edges[k], graph.edges[k]) for k in graph.edges)
    if AIFB.exists():
        central = load_hetero_folder(AIFB / "centralized_1" / "client-0")
        assert (central.train_idx.size, central.val_idx.size, central.test_idx.size) == (
            112, 28, 36)
        assert len(central.edge_types) == 104 and central.num_classes == 4


@pytest.mark.parametrize("breakage, message", [
    (lambda m, a: a.pop("edge_index_1"), "array 'edge_index_1' is missing"),
    (lambda m, a: a.update(edge_index_0=np.array([[0, 5], [1, 1]])),
     "source id out of range [0, 3) for node type 'paper'"),
    (lambda m, a: m.update(target_node_type="venue"), "target_node_type 'venue' is not one"),
    (lambda m, a: m["edge_types"].append(["paper", "x", "venue"]), "names node type 'venue'"),
    (lambda m, a: a.update(y=np.array([0, 1])), "y must hold one label per paper node"),
    (lambda m, a: a.update(val_idx=np.array([0])), "overlap"),
    (lambda m, a: a.update(train_idx=np.array([], np.int64)), "train_idx is empty"),
    (lambda m, a: a.update(num_nodes=np.array([3.0, 2.0])), "must hold integers"),
])
def test_malformed_folders_are_refused_clearly(tmp_path: Path, breakage, message: str) -> None:
    save_hetero_folder(small_graph(), tmp_path)
    meta = json.loads((tmp_path / "meta.json").read_text())
    with np.load(tmp_path / "arrays.npz") as z:
        arrays = {k: z[k] for k in z.files}
    breakage(meta, arrays)
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    np.savez_compressed(tmp_path / "arrays.npz", **arrays)
    with pytest.raises(HeteroFormatError, match=message.replace("[", r"\[").replace(
            "(", r"\(").replace(")", r"\)")):
        load_hetero_folder(tmp_path)


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(HeteroFormatError, match="no such data folder"):
        load_hetero_folder(tmp_path / "nope")
    tmp_path.joinpath("meta.json").write_text("{not json")
    with pytest.raises(HeteroFormatError, match="not readable JSON"):
        load_hetero_folder(tmp_path)
    save_hetero_folder(small_graph(), tmp_path)
    tmp_path.joinpath("arrays.npz").write_bytes(b"garbage")
    with pytest.raises(HeteroFormatError, match="not a readable .npz"):
        load_hetero_folder(tmp_path)


def test_model_equals_the_per_edge_type_definition() -> None:
    """The folded sparse operators compute §5.2 exactly: per canonical type, mean over
    in-neighbours; relation names tie W_r = sum_b beta_rb V_b; right degree clamped to 1."""
    torch.manual_seed(0)
    graph = small_graph()
    ops = build_operators(graph)
    model = BasisRGCN(graph.num_nodes, graph.node_types, ops.num_relations, 2, hidden=8,
                      num_bases=3)
    got = model(ops)
    emb = {t: model.embeddings[i] for i, t in enumerate(graph.node_types)}

    h1 = {t: torch.relu(sum((mean_in(graph, emb, c) for c in graph.edge_types if c[2] == t),
                            torch.zeros(graph.num_nodes[t], 8)) + model.layer1.bias)
          for t in graph.node_types}
    weights = torch.einsum("rb,bde->rde", model.coefficients, model.layer2.bases)
    rel = {r: i for i, r in enumerate(graph.relations)}
    h2 = sum(mean_in(graph, h1, c) @ weights[rel[c[1]]]
             for c in graph.edge_types if c[2] == "paper")
    want = model.decoder(torch.relu(h2 + model.layer2.bias))
    assert torch.allclose(got, want, atol=1e-5)


def test_shared_tensors_do_not_depend_on_the_schema() -> None:
    graph = small_graph()
    one = BasisRGCN(graph.num_nodes, graph.node_types, 3, 4)
    other = BasisRGCN({"a": 10, "b": 4, "c": 7}, ("a", "b", "c"), 40, 4)
    shapes = [(n, one.get_parameter(n).shape) for n in one.shared_names()]
    assert shapes == [(n, other.get_parameter(n).shape) for n in other.shared_names()]
    assert shapes == [("layer1.bias", (64,)), ("layer2.bases", (20, 64, 64)),
                      ("layer2.bias", (64,)), ("decoder.weight", (4, 64)),
                      ("decoder.bias", (4,))]
    names = " ".join(n for n, _ in other.named_parameters())
    assert not any(t in names.split(".") for t in ("a", "b", "c"))


def test_alignment_pulls_each_relation_to_its_nearest_pooled_vector() -> None:
    coefficients = torch.tensor([[0.0, 0.0], [1.0, 1.0]], requires_grad=True)
    pool = torch.tensor([[0.0, 1.0], [1.0, 1.0], [5.0, 5.0]])
    loss = alignment_loss(coefficients, pool)
    assert loss.item() == pytest.approx(1.0)          # 1 (to [0, 1]) + 0 (to [1, 1])
    loss.backward()
    assert torch.equal(coefficients.grad, torch.tensor([[0.0, -2.0], [0.0, 0.0]]))
    assert alignment_loss(coefficients, None).item() == 0.0


def test_split_command_cuts_aifb_like_the_paper(tmp_path: Path) -> None:
    """random-edges K=3 on AIFB: per-silo averages close to the paper's Table 5."""
    from typer.testing import CliRunner

    from trellis.silo.cli.app import app
    from trellis.silo.data.hetero_split import forward_edge_types

    if not AIFB.exists():
        pytest.skip("needs ../shared/data/hetero")
    runner = CliRunner()
    result = runner.invoke(app, ["split-hetero", "--input",
                                 str(AIFB / "centralized_1" / "client-0"), "--method",
                                 "random-edges", "--clients", "3", "--out", str(tmp_path / "re")])
    assert result.exit_code == 0, result.output
    silos = [load_hetero_folder(tmp_path / "re" / f"client-{k}") for k in range(3)]
    edges = [sum(e.shape[1] for e in g.edges.values()) for g in silos]
    nodes = [g.total_nodes for g in silos]
    # Table 5, AIFB RE K=3: 26,032.0 edges and 4,818.7 nodes per client on average.
    assert abs(np.mean(edges) - 26032.0) < 0.02 * 26032 and abs(np.mean(nodes) - 4818.7) < 150
    for g in silos:            # reverse edges were removed before cutting and added after
        assert len(forward_edge_types(g)) * 2 == len(g.edge_types)
    bad = runner.invoke(app, ["split-hetero", "--input", str(tmp_path / "nope"), "--method",
                              "random-edges", "--clients", "3", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "no such data folder" in bad.output
    bad = runner.invoke(app, ["split-hetero", "--input", str(tmp_path), "--method", "by-hand",
                              "--clients", "3", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "valid choices: random-edges, random-etypes" in bad.output


def test_etype_split_gives_silos_different_schemas() -> None:
    from trellis.silo.data.hetero_split import split_graph

    if not AIFB.exists():
        pytest.skip("needs ../shared/data/hetero")
    graph = load_hetero_folder(AIFB / "centralized_1" / "client-0")
    silos = split_graph(graph, "random-etypes", 5, seed=7)
    schemas = {g.edge_types for g in silos}
    assert len(schemas) == 5 and all(len(g.edge_types) < len(graph.edge_types) for g in silos)
    assert all(g.train_idx.size and g.val_idx.size and g.test_idx.size for g in silos)


def test_hetero_trainer_learns_shares_only_schema_free_tensors_and_aligns() -> None:
    from trellis.silo.training.hgn_trainer import HeteroTrainer, HGNConfig

    if not AIFB.exists():
        pytest.skip("needs ../shared/data/hetero")
    a = HeteroTrainer(load_hetero_folder(AIFB / "random-etypes_3" / "client-0"), HGNConfig(),
                      1000, "fed", "a", 4)
    b = HeteroTrainer(load_hetero_folder(AIFB / "random-etypes_3" / "client-1"), HGNConfig(),
                      1000, "fed", "b", 4)
    # Different schemas, one shared layout, starting from the same values.
    assert a.coefficient_rows().shape[0] != b.coefficient_rows().shape[0]
    assert a.layout == b.layout and np.array_equal(a.get_shared(), b.get_shared())
    losses = [a.train()["train_loss"] for _ in range(10)]
    assert losses[-1] < losses[0]
    acc, _, count = a.evaluate("val")
    assert count == a.graph.val_idx.size and 0.0 <= acc <= 1.0
    # Alignment pulls a's coefficients towards b's pool.
    pool = b.coefficient_rows()
    before = alignment_loss(torch.from_numpy(a.coefficient_rows()), torch.from_numpy(pool))
    a.set_pool(pool)
    a.train()
    after = alignment_loss(torch.from_numpy(a.coefficient_rows()), torch.from_numpy(pool))
    assert after < before
    with pytest.raises(ValueError, match="shape"):
        a.set_pool(np.zeros((3, 7)))
    with pytest.raises(ValueError, match="NaN"):
        a.set_shared(np.full(a.layout.length, np.nan))
