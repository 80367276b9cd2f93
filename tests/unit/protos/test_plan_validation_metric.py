"""training.validation_metric: the default leaves the wire form (and so every plan's hash)
as it was; another value travels, round-trips, and a bad one is refused with its path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
classes = {classes}
"""


def _plan(tmp_path: Path, training: str = "", algorithm: str = "fedstar", classes: int = 2):
    path = tmp_path / "plan.toml"
    path.write_text(PLAN.format(training=training, algorithm=algorithm, classes=classes))
    return load_plan(path)


def test_the_default_is_accuracy_and_is_left_out_of_the_wire_form(tmp_path: Path) -> None:
    plain = _plan(tmp_path).public
    named = _plan(tmp_path, 'validation_metric = "acc"').public
    assert plain.training.validation_metric == "acc"
    assert plain == named and plain.sha256() == named.sha256()
    # The wire form holds exactly the fields it held before the metric existed.
    assert set(json.loads(plain.to_json())["training"]) == {
        "lr", "weight_decay", "batch_size", "local_epochs", "split_seed", "mu"}
    assert PublicPlan.from_json(plain.to_json()) == plain


@pytest.mark.parametrize("metric", ["balanced_acc", "roc_auc"])
def test_another_metric_travels_changes_the_hash_and_round_trips(tmp_path: Path,
                                                                 metric: str) -> None:
    plan = _plan(tmp_path, f'validation_metric = "{metric}"').public
    assert json.loads(plan.to_json())["training"]["validation_metric"] == metric
    assert plan.sha256() != _plan(tmp_path).public.sha256()
    assert PublicPlan.from_json(plan.to_json()) == plan


def test_an_unknown_metric_is_refused_with_its_path_and_the_choices(tmp_path: Path) -> None:
    with pytest.raises(PlanError) as caught:
        _plan(tmp_path, 'validation_metric = "f1"')
    assert caught.value.problems == [
        "training.validation_metric: 'f1' is not a validation metric; valid choices: acc, "
        "balanced_acc, roc_auc"]
    wire = json.loads(_plan(tmp_path).public.to_json())
    wire["training"]["validation_metric"] = 3
    with pytest.raises(PlanError, match="training.validation_metric: 3 is not a validation"):
        PublicPlan.from_json(json.dumps(wire))


def test_roc_auc_is_refused_for_a_fedhgn_plan_of_more_than_two_classes(tmp_path: Path) -> None:
    with pytest.raises(PlanError) as caught:
        _plan(tmp_path, 'validation_metric = "roc_auc"', algorithm="fedhgn", classes=4)
    assert caught.value.problems == [
        "training.validation_metric: roc_auc needs a binary task; fedhgn.classes is 4 (use "
        "balanced_acc or acc)"]
    binary = _plan(tmp_path, 'validation_metric = "roc_auc"', algorithm="fedhgn", classes=2)
    assert binary.public.training.validation_metric == "roc_auc"
