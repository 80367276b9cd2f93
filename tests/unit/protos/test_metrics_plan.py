"""[metrics] aggregate: left out of the wire form at its default (every plan keeps its hash),
refused where counts cannot be summed honestly, and the slots' layout, encoding and figures
computed by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trellis.protos.metrics_plan import (
    COUNT_UNITS,
    MetricsConfig,
    decode_sums,
    encode_counts,
    federation_figures,
    metric_slots,
)
from trellis.protos.plan import PlanError, PublicPlan, load_plan

PLAN = """
[federation]
id = "chem"
algorithm = "{algorithm}"
rounds = 5
silos = ["a", "b", "c"]

[training]
{training}

[fedhgn]
classes = 2
{extra}
"""
PRIVATE = """
[privacy]
mechanism = "ddg"
unit = "{unit}"
noise_multiplier = 1.0
design_graphs = 600
"""


def _plan(tmp_path: Path, extra: str = "", *, algorithm: str = "fedstar", training: str = ""):
    path = tmp_path / "plan.toml"
    path.write_text(PLAN.format(algorithm=algorithm, training=training, extra=extra))
    return load_plan(path)


def _problems(tmp_path: Path, extra: str, **kwargs: str) -> list[str]:
    with pytest.raises(PlanError) as caught:
        _plan(tmp_path, extra, **kwargs)
    return caught.value.problems


def test_without_the_table_every_plan_keeps_the_hash_it_had(tmp_path: Path) -> None:
    # The hashes these plans had before [metrics] existed (commit bee7fdb).
    assert _plan(tmp_path).public.sha256() == (
        "7f9a958e7a6ce90da130cd4c09cb41d720dd69612153bc21797fe1afcebcd349")
    assert _plan(tmp_path, algorithm="fedhgn", training='validation_metric = "balanced_acc"'
                 ).public.sha256() == (
        "51489d4a2b456ca7a7146e52131bafc8c21ff8b256504a43fe3bd3c53170956c")
    off = _plan(tmp_path, "[metrics]\naggregate = false").public
    assert off == _plan(tmp_path).public and "metrics" not in json.loads(off.to_json())


def test_the_option_travels_changes_the_hash_and_round_trips(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "[metrics]\naggregate = true\nclasses = 2",
                 training='validation_metric = "balanced_acc"').public
    assert json.loads(plan.to_json())["metrics"] == {
        "aggregate": True, "classes": 2, "noise_multiplier": 0.0, "loss_clip": 10.0}
    assert PublicPlan.from_json(plan.to_json()) == plan
    assert plan.sha256() != _plan(tmp_path, training='validation_metric = "balanced_acc"'
                                  ).public.sha256()
    # The counts need the 64-bit ring: "auto" takes it rather than the 32-bit one.
    ring = ('[aggregation]\nring_bits = "auto"\nclip = 1.0\nfraction_bits = 8\n'
            "max_sample_count = 20000\n")
    assert _plan(tmp_path, ring).public.aggregation.ring_bits == 32
    auto = _plan(tmp_path, ring + "[metrics]\naggregate = true").public
    assert auto.aggregation.ring_bits == 64


@pytest.mark.parametrize(("algorithm", "training", "extra", "expected"), [
    ("fedstar", 'validation_metric = "roc_auc"', "", "metrics.aggregate: ROC-AUC ranks every "
     "silo's scores together, so no sum of counts gives it; select rounds by \"balanced_acc\" "
     "or \"acc\""),
    ("gcfl", "", "", "metrics.aggregate: gcfl sums per cluster, and a cluster's sum is its "
     "members' figures (one member: its own); it is refused rather than half-hidden"),
    ("local", "", "", "metrics.aggregate: local aggregates nothing, so no masked vector carries "
     "the counts; silos report per silo (or use --report none)"),
    ("fedstar", 'validation_metric = "balanced_acc"', "", "metrics.classes: balanced accuracy "
     "is summed per class; give the number of classes (at least 2)"),
    ("fedstar", "", "noise_multiplier = 2.0", "metrics.noise_multiplier: applies only with "
     "[privacy]"),
])
def test_what_cannot_be_summed_honestly_is_refused_with_the_reason(
        tmp_path: Path, algorithm: str, training: str, extra: str, expected: str) -> None:
    problems = _problems(tmp_path, f"[metrics]\naggregate = true\n{extra}", algorithm=algorithm,
                         training=training)
    assert expected in problems


def test_with_privacy_the_counts_need_their_own_noise_and_record_level(tmp_path: Path) -> None:
    assert _problems(tmp_path, "[metrics]\naggregate = true\n" + PRIVATE.format(unit="record")
                     ) == ["metrics.noise_multiplier: required with [privacy]: the counts' own "
                           "noise (std over their sensitivity), accounted on top of the "
                           "model's epsilon"]
    problems = _problems(tmp_path, "[metrics]\naggregate = true\nnoise_multiplier = 5\n"
                         + PRIVATE.format(unit="silo"))
    assert "metrics.aggregate: with silo-level privacy one silo moves its counts by its whole "\
        "validation set, which no noise of a useful size covers; use record-level privacy or "\
        "leave metrics out" in problems
    plan = _plan(tmp_path, "[metrics]\naggregate = true\nnoise_multiplier = 5\n"
                 + PRIVATE.format(unit="record")).public
    assert plan.metrics.noise_multiplier == 5.0


def test_fields_without_the_option_and_bad_values_are_refused(tmp_path: Path) -> None:
    assert _problems(tmp_path, "[metrics]\nclasses = 3") == [
        "metrics: its fields apply only with metrics.aggregate = true"]
    problems = _problems(tmp_path, '[metrics]\naggregate = "yes"\nloss_clip = 0\nbins = 2')
    assert "metrics.aggregate: must be true or false, got 'yes'" in problems
    assert any(p.startswith("metrics.loss_clip: must be") for p in problems)
    assert any(p.startswith("metrics.bins: unknown field") for p in problems)


def test_the_layout_puts_each_split_then_its_classes() -> None:
    assert metric_slots(MetricsConfig()) == ()
    assert metric_slots(MetricsConfig(aggregate=True)) == (
        "val_correct", "val_count", "val_loss_sum", "test_correct", "test_count",
        "test_loss_sum")
    assert metric_slots(MetricsConfig(aggregate=True, classes=2))[:7] == (
        "val_correct", "val_count", "val_loss_sum", "val_correct_0", "val_correct_1",
        "val_count_0", "val_count_1")


def test_summed_encodings_decode_to_the_summed_counts_and_pooled_figures() -> None:
    config = MetricsConfig(aggregate=True, classes=2, loss_clip=4.0)
    # Two silos: 3 of 4 and 1 of 2 validation graphs right; class 0: 2/2 and 0/1, class 1:
    # 1/2 and 1/1.
    silos = [{"val_correct": 3, "val_count": 4, "val_loss_sum": 2.5, "val_correct_0": 2,
              "val_count_0": 2, "val_correct_1": 1, "val_count_1": 2, "test_count": 0},
             {"val_correct": 1, "val_count": 2, "val_loss_sum": 1.25, "val_correct_0": 0,
              "val_count_0": 1, "val_correct_1": 1, "val_count_1": 1, "test_count": 0}]
    total = sum(encode_counts(s, config) for s in silos)
    sums = decode_sums(total, config)
    assert sums["val_correct"] == 4 and sums["val_count"] == 6 and sums["val_loss_sum"] == 3.75
    figures = federation_figures(sums, config)
    assert figures == {"val_count": 6.0, "val_acc": 4 / 6, "val_loss": 3.75 / 6,
                       "val_balanced_acc": (2 / 3 + 2 / 3) / 2}   # no test graph: no figure
    # A loss is kept to loss_clip / COUNT_UNITS.
    one = decode_sums(encode_counts({"val_loss_sum": math.pi}, config), config)
    assert abs(one["val_loss_sum"] - math.pi) <= 0.5 * 4.0 / COUNT_UNITS
    with pytest.raises(ValueError, match="finite and non-negative"):
        encode_counts({"val_count": -1}, config)


def test_noisy_sums_give_clamped_figures_and_skip_empty_classes() -> None:
    config = MetricsConfig(aggregate=True, classes=2)
    sums = dict.fromkeys(metric_slots(config), 0.0) | {
        "val_correct": 7.2, "val_count": 6.9, "val_loss_sum": -0.3, "val_correct_0": 3.1,
        "val_count_0": 2.9, "val_correct_1": 0.2, "val_count_1": 0.3}
    figures = federation_figures(sums, config)
    assert figures["val_acc"] == 1.0 and figures["val_loss"] == 0.0
    assert figures["val_balanced_acc"] == 1.0      # class 1 counted under half a graph
    assert "test_acc" not in figures

