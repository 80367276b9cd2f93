"""Every group an algorithm's row declares freezable ([model] frozen) is a top-level module of
the model the row builds, and its shared groups are among them."""

from __future__ import annotations

from trellis.protos.algorithms import ALGORITHMS
from trellis.protos.plan import ModelConfig
from trellis.silo.models.graph_classifiers import graph_model


def test_every_freezable_group_is_a_top_level_module_of_the_rows_model() -> None:
    checked = 0
    for row in ALGORITHMS.values():
        if not row.freezable:
            continue
        model = graph_model(row.model).build(5, 2, ModelConfig())
        groups = {name.split(".")[0] for name, _ in model.named_parameters()}
        assert set(row.freezable) == groups, row.name
        assert set(row.shares) <= set(row.freezable), row.name
        checked += 1
    assert checked >= 3        # fedstar, feddense and the GIN rows at least
