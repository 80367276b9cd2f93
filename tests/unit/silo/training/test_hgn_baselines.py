"""FedHGN's baselines (docs/algorithms.md §5.6): full-weight RGCN, union schema, FedProx,
Central."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from tests.unit.silo.data.test_hetero import AIFB, mean_in, small_graph
from trellis.silo.data.hetero import HeteroGraph, load_hetero_folder
from trellis.silo.models.hgn import BasisRGCN, build_operators
from trellis.silo.training.hgn_baselines import train_alone, weighted_accuracy
from trellis.silo.training.hgn_trainer import HeteroTrainer, HGNConfig

FULL = HGNConfig(hidden=8, num_bases=0)


def by_hand(graph: HeteroGraph, model: BasisRGCN, slot: dict[str, int]) -> torch.Tensor:
    """§5.2 with a full weight W_r per relation name, written per canonical edge type."""
    emb = {t: model.embeddings[i] for i, t in enumerate(graph.node_types)}
    hidden = model.layer1.bias.shape[0]
    h1 = {t: torch.relu(sum((mean_in(graph, emb, c) for c in graph.edge_types if c[2] == t),
                            torch.zeros(graph.num_nodes[t], hidden)) + model.layer1.bias)
          for t in graph.node_types}
    h2 = sum(mean_in(graph, h1, c) @ model.layer2.weights[slot[c[1]]]
             for c in graph.edge_types if c[2] == graph.target_type)
    return model.decoder(torch.relu(h2 + model.layer2.bias))


def proximal(trainer: HeteroTrainer) -> float:
    """The trainer's FedProx term as a number."""
    return float(trainer.proximal_term().detach())


def planted_graph(seed: int = 0, items: int = 60) -> HeteroGraph:
    """Items labelled i % 3, each tagged with one of its class's two tags plus a random tag,
    and near two items of its own class (so layer 2 sees the class's tags)."""
    rng = np.random.default_rng(seed)
    labels = np.arange(items) % 3
    own = labels * 2 + rng.integers(0, 2, items)
    noise = rng.integers(0, 6, items)
    has = np.stack([np.concatenate([np.arange(items)] * 2), np.concatenate([own, noise])])
    dst = np.repeat(np.arange(items), 2)
    near = np.stack([(dst + 3 * rng.integers(1, items // 3, dst.size)) % items, dst])
    edges = {("item", "has", "tag"): has, ("tag", "rev_has", "item"): has[::-1].copy(),
             ("item", "near", "item"): near}
    order = rng.permutation(items)
    return HeteroGraph(("item", "tag"), {"item": items, "tag": 6}, tuple(edges), edges, "item",
                       3, labels, np.sort(order[:30]), np.sort(order[30:45]),
                       np.sort(order[45:]))


def test_full_weight_model_has_one_weight_per_relation_and_computes_5_2() -> None:
    torch.manual_seed(0)
    graph = small_graph()
    ops = build_operators(graph)
    model = BasisRGCN(graph.num_nodes, graph.node_types, ops.num_relations, 2, hidden=8,
                      num_bases=0)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert shapes == {"embeddings.0": (3, 8), "embeddings.1": (2, 8), "layer1.bias": (8,),
                      "layer2.weights": (3, 8, 8), "layer2.bias": (8,),
                      "decoder.weight": (2, 8), "decoder.bias": (2,)}
    assert model.coefficients is None and "coefficients" not in model.state_dict()
    assert model.shared_names() == ["layer1.bias", "layer2.weights", "layer2.bias",
                                    "decoder.weight", "decoder.bias"]
    # Xavier-uniform (ReLU gain) over the whole [R, d, d] tensor, as the reference.
    bound = math.sqrt(2.0) * math.sqrt(6.0 / (8 * 8 + 3 * 8))
    assert float(model.layer2.weights.detach().abs().max()) <= bound
    assert not torch.equal(model.layer2.weights[0], model.layer2.weights[1])
    slot = {r: i for i, r in enumerate(graph.relations)}
    assert torch.allclose(model(ops), by_hand(graph, model, slot), atol=1e-5)
    # The same computation over a wider relation list, laid out in another order.
    union = ("zzz", "writtenBy", "cites", "aaa", "rev_writtenBy")
    wide_ops = build_operators(graph, union)
    wide = BasisRGCN(graph.num_nodes, graph.node_types, len(union), 2, hidden=8, num_bases=0)
    wide.load_state_dict({k: v for k, v in model.state_dict().items() if k != "layer2.weights"},
                         strict=False)
    with torch.no_grad():
        for r, i in slot.items():
            wide.layer2.weights[union.index(r)] = model.layer2.weights[i]
    assert torch.allclose(wide(wide_ops), model(ops), atol=1e-6)
    with pytest.raises(ValueError, match="relation slots"):
        wide(ops)


def test_union_schema_trainer_maps_relations_by_name_and_refuses_a_foreign_one() -> None:
    graph = small_graph()
    fewer = HeteroGraph(graph.node_types, graph.num_nodes, graph.edge_types[:2],
                        {c: graph.edges[c] for c in graph.edge_types[:2]}, "paper", 2,
                        graph.labels, graph.train_idx, graph.val_idx, graph.test_idx)
    union = ("writtenBy", "rev_writtenBy", "cites")
    a = HeteroTrainer(graph, FULL, 7, "fed", "a", 2, relations=union)
    b = HeteroTrainer(fewer, FULL, 7, "fed", "b", 2, relations=union)
    assert a.relations == b.relations == union and a.ops.num_relations == 3
    # One layout over the union, same initial values on every silo.
    assert a.layout == b.layout and np.array_equal(a.get_shared(), b.get_shared())
    assert dict(zip(a.layout.names, a.layout.shapes, strict=True))["layer2.weights"] == (3, 8, 8)
    # Operator rows of a relation sit in its union slot, whatever the silo's own order.
    own = build_operators(graph)
    own_rows = own.layer2.to_dense().view(3, 3, -1)
    union_rows = a.ops.layer2.to_dense().view(3, 3, -1)
    for r in graph.relations:
        assert torch.equal(union_rows[union.index(r)], own_rows[graph.relations.index(r)])
    # b lacks rev_writtenBy: its slot has no edges, so the task leaves that weight alone.
    assert "rev_writtenBy" not in fewer.relations
    before = b.model.layer2.weights.detach().clone()
    b.train()
    after = b.model.layer2.weights.detach()
    assert torch.equal(after[1], before[1]) and not torch.equal(after[2], before[2])
    with pytest.raises(ValueError, match=r"silo 'c': .*1 relation\(s\) that are not in the "
                                         r"given relation list: 'cites'"):
        HeteroTrainer(graph, FULL, 7, "fed", "c", 2, relations=("writtenBy", "rev_writtenBy"))
    with pytest.raises(ValueError, match="twice"):
        HeteroTrainer(graph, FULL, 7, "fed", "c", 2, relations=union + ("cites",))


def test_fedprox_term_is_zero_at_the_global_point_and_pulls_towards_it() -> None:
    graph = planted_graph()
    relations = graph.relations
    trainers = {mu: HeteroTrainer(graph, HGNConfig(hidden=8, num_bases=0, mu=mu,
                                                   local_epochs=5), 3, "fed", "a", 3,
                                  relations=relations)
                for mu in (0.0, 5.0)}
    start = trainers[0.0].get_shared()
    prox = trainers[5.0]
    # Over every non-embedding parameter, the decoder included (§5.6).
    assert set(prox.layout.names) == {n for n, _ in prox.model.named_parameters()
                                      if not n.startswith("embeddings.")}
    assert proximal(prox) == 0.0                   # the initial values are w_global
    # w_global is what set_shared loaded: a hand-made offset of 0.1 gives 0.01 per value.
    prox.set_shared(start)
    prox.layout.load(prox.model, start + np.float32(0.1))
    assert proximal(prox) == pytest.approx(0.01 * prox.layout.length, rel=1e-4)
    moved = {}
    for mu, trainer in trainers.items():
        trainer.set_shared(start)
        assert proximal(trainer) == 0.0
        trainer.train()
        moved[mu] = float(np.linalg.norm(trainer.get_shared() - start))
    print("distance moved from w_global:", moved)
    assert 0.0 < moved[5.0] < 0.8 * moved[0.0]
    # The anchor survives a snapshot on disk.
    copy = HeteroTrainer(graph, prox.config, 99, "fed", "a", 3, relations=relations)
    copy.from_bytes(prox.to_bytes())
    assert np.array_equal(copy.get_shared(), prox.get_shared())
    assert proximal(copy) == pytest.approx(proximal(prox))


def test_full_weight_trainer_fits_the_session_duck_type() -> None:
    trainer = HeteroTrainer(small_graph(), FULL, 1, "fed", "a", 2)
    assert trainer.coefficient_rows().shape == (0, 0)
    assert HeteroTrainer(small_graph(), HGNConfig(hidden=8, num_bases=-1), 1, "fed", "a",
                         2).coefficient_rows().shape == (0, 0)
    trainer.set_pool(None)
    with pytest.raises(ValueError, match="no coefficients"):
        trainer.set_pool(np.zeros((2, 3), np.float32))
    assert trainer.update_statistics == {} and trainer.last_update is None
    values = trainer.metrics(["val_count", "test_acc", "train_loss"])
    acc, _, count = trainer.evaluate("test")
    assert values == {"val_count": 1.0, "test_acc": acc} and count == 1
    assert isinstance(values["val_count"], float)
    assert set(trainer.metrics()) == {"val_acc", "val_loss", "test_acc", "test_loss"}
    basis = HeteroTrainer(small_graph(), HGNConfig(hidden=8, num_bases=4), 1, "fed", "a", 2)
    assert basis.coefficient_rows().shape == (3, 4)


def test_train_alone_stops_early_from_the_best_epoch_and_is_deterministic() -> None:
    graph = planted_graph()
    config = HGNConfig(hidden=16, num_bases=0, lr=0.5)
    result = train_alone(graph, config, seed=1, name="a", max_epochs=300, patience=5)
    print("planted graph:", {k: v for k, v in result.items() if k != "curve"})
    json.dumps(result)
    epochs, best, curve = result["epochs"], result["best_epoch"], result["curve"]
    assert epochs < 300 and best == epochs - 5 and len(curve) == epochs
    # The best epoch is the first to reach the top accuracy, and its model is the one tested.
    assert best == curve.index(max(curve)) + 1 and round(result["val_acc"], 4) == max(curve)
    assert result["val_acc"] > 0.6 and 0.0 <= result["test_acc"] <= 1.0
    assert (result["val_count"], result["test_count"]) == (15, 15)
    # Deterministic per (seed, name); bases in the config are ignored (forced to 0).
    again = train_alone(graph, HGNConfig(hidden=16, num_bases=20, lr=0.5), seed=1, name="a",
                        max_epochs=300, patience=5)
    assert again == result
    other = train_alone(graph, config, seed=1, name="b", max_epochs=300, patience=5)
    assert other["curve"] != curve
    # Hitting max_epochs ends the run too.
    short = train_alone(graph, config, seed=1, name="a", max_epochs=3, patience=50)
    assert short["epochs"] == 3 and short["curve"] == curve[:3]
    with pytest.raises(ValueError, match="no validation nodes"):
        train_alone(HeteroGraph(graph.node_types, graph.num_nodes, graph.edge_types,
                                graph.edges, "item", 3, graph.labels, graph.train_idx,
                                np.zeros(0, np.int64), graph.test_idx),
                    config, seed=1, name="a")


def test_weighted_accuracy_weights_by_count_and_ignores_empty_silos() -> None:
    per_silo = {"a": {"test_acc": 0.5, "test_count": 2, "val_acc": 1.0, "val_count": 1},
                "b": {"test_acc": 1.0, "test_count": 6, "val_acc": 0.0, "val_count": 3},
                "c": {"test_acc": float("nan"), "test_count": 0, "val_acc": 0.2,
                      "val_count": 1}}
    assert weighted_accuracy(per_silo, "test") == pytest.approx((0.5 * 2 + 1.0 * 6) / 8)
    assert weighted_accuracy(per_silo, "val") == pytest.approx((1.0 + 0.0 + 0.2) / 5)
    with pytest.raises(ValueError, match="no silo has test nodes"):
        weighted_accuracy({"c": per_silo["c"]}, "test")
    with pytest.raises(ValueError, match="'val' or 'test'"):
        weighted_accuracy(per_silo, "train")


def test_central_aifb_is_close_to_the_paper() -> None:
    """Central on AIFB (paper: 87.78 +- 2.22)."""
    if not AIFB.exists():
        pytest.skip("needs ../shared/data/hetero")
    graph = load_hetero_folder(AIFB / "centralized_1" / "client-0")
    result = train_alone(graph, HGNConfig(num_bases=0, lr=0.1), seed=1000, name="central")
    print(f"Central AIFB: test accuracy {result['test_acc']:.4f} (best epoch "
          f"{result['best_epoch']} of {result['epochs']})")
    assert result["test_acc"] >= 0.75 and result["test_count"] == 36
