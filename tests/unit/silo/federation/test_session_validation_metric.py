"""A silo and the plan's validation metric: it refuses ROC-AUC for more than two classes before
anything is sent, reports the metric by default, and says so when its --report leaves it out."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from tests.unit.silo.data.test_hetero import small_graph
from trellis.crypto.pki import Identity, throwaway_identities
from trellis.protos.plan import (
    AggregationConfig,
    HeteroConfig,
    ModelConfig,
    PublicPlan,
    TrainingConfig,
)
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.data.tu import GraphDataset, load_tu_folder
from trellis.silo.federation.reported_metrics import DEFAULT_REPORT
from trellis.silo.federation.session import SiloSession
from trellis.silo.training.hgn_trainer import HeteroTrainer, HGNConfig
from trellis.silo.training.trainers import make_silo_trainer


@pytest.fixture(scope="module")
def identity(tmp_path_factory: pytest.TempPathFactory) -> Identity:
    return throwaway_identities(["a"], tmp_path_factory.mktemp("metric-id"))["a"]


@pytest.fixture(scope="module")
def binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tu_folder(tmp_path_factory.mktemp("mol"), "MOL", "molecules", 40, seed=3)


@pytest.fixture(scope="module")
def three_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tu_folder(tmp_path_factory.mktemp("bio"), "BIO", "bio", 45, seed=3)


def _plan(metric: str) -> PublicPlan:
    return PublicPlan(federation="f", algorithm="fedavg", rounds=2, seed=1,
                      model=ModelConfig(hidden=8, layers=1),
                      training=TrainingConfig(validation_metric=metric),
                      aggregation=AggregationConfig())


def _session(identity: Identity, data: GraphDataset, report: tuple[str, ...] | None = None
             ) -> SiloSession:
    return SiloSession(identity, lambda plan: make_silo_trainer(data, plan, "a"), report=report)


def test_more_than_two_classes_refuse_a_roc_auc_plan_in_one_line(identity, three_classes
                                                                  ) -> None:
    session = _session(identity, load_tu_folder(three_classes))
    with pytest.raises(ValueError) as caught:
        session.accept_plan(_plan("roc_auc").to_json())
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        'the plan selects rounds by ROC-AUC (training.validation_metric = "roc_auc"), which '
        "needs a binary task; silo 'a' has 3 classes in its data, so it refuses the plan "
        "(nothing was sent); ask the coordinator operator for balanced_acc or acc")
    assert session.plan is None and session.trainer is None
    # Balanced accuracy suits any number of classes.
    other = _session(identity, load_tu_folder(three_classes))
    assert other.accept_plan(_plan("balanced_acc").to_json()).training.validation_metric == (
        "balanced_acc")


def test_the_default_report_carries_the_plans_metric_and_the_file_every_figure(
        identity, binary) -> None:
    session = _session(identity, load_tu_folder(binary))
    assert session.report_names == DEFAULT_REPORT
    session.accept_plan(_plan("roc_auc").to_json())
    assert session.report_names == (*DEFAULT_REPORT, "val_roc_auc", "test_roc_auc")
    assert session.report_warning() == ""
    report = session.metrics_report(1)
    assert report is not None
    assert set(report.metrics) == {"val_acc", "test_acc", "val_roc_auc", "test_roc_auc"}
    assert all(0.0 <= v <= 1.0 for v in report.metrics.values() if not math.isnan(v))
    # The silo's own figures hold balanced accuracy and ROC-AUC whatever it reports.
    assert {"val_balanced_acc", "test_balanced_acc", "val_roc_auc", "test_roc_auc",
            "val_loss", "test_loss"} <= set(session.own_metrics)


def test_an_accuracy_plan_reports_what_it_always_did(identity, binary) -> None:
    session = _session(identity, load_tu_folder(binary))
    session.accept_plan(_plan("acc").to_json())
    assert session.report_names == DEFAULT_REPORT
    report = session.metrics_report(1)
    assert report is not None and set(report.metrics) == {"val_acc", "test_acc"}


def test_an_explicit_report_without_the_metric_is_kept_with_a_warning(identity, binary
                                                                       ) -> None:
    session = _session(identity, load_tu_folder(binary), report=("test_acc",))
    session.accept_plan(_plan("balanced_acc").to_json())
    assert session.report_names == ("test_acc",)
    assert session.report_warning() == (
        "the plan selects its best round by val_balanced_acc (training.validation_metric), "
        "which this silo's --report leaves out (test_acc): the coordinator selects without "
        "this silo's figures; add val_balanced_acc,test_balanced_acc to --report to count them")
    report = session.metrics_report(1)
    assert report is not None and set(report.metrics) == {"test_acc"}
    silent = _session(identity, load_tu_folder(binary), report=())
    silent.accept_plan(_plan("balanced_acc").to_json())
    assert "leaves out (none)" in silent.report_warning()


def test_an_undefined_roc_auc_is_kept_home_and_not_reported(identity) -> None:
    # One validation and one test node: each split holds one class, so no ROC-AUC.
    plan = replace(_plan("roc_auc"), algorithm="fedhgn", hetero=HeteroConfig(classes=2))
    session = SiloSession(identity, lambda p: HeteroTrainer(
        small_graph(), HGNConfig(hidden=8, num_bases=4), 1, "f", "a", 2))
    session.accept_plan(plan.to_json())
    assert "val_roc_auc" in session.report_names
    report = session.metrics_report(1)
    assert report is not None
    # The counts go with the accuracies they weight, and nothing goes for the undefined AUC.
    assert set(report.metrics) == {"val_acc", "test_acc", "val_count", "test_count"}
    assert math.isnan(session.own_metrics["val_roc_auc"])
