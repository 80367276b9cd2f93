"""Figures over silos do not depend on the order their reports arrived in.

Silos report concurrently in a real federation and in the Ray engine; float sums taken in arrival
order differed in the last bit (a mean test accuracy of 0.5000000000000001 against 0.5).
"""

from __future__ import annotations

import itertools
from pathlib import Path

from trellis.coordinator.rounds.machine import RoundRecord
from trellis.coordinator.state.results import build_results
from trellis.protos.metrics import weighted_accuracy
from trellis.protos.plan import parse_plan

# Three values whose float sum depends on the order they are added in.
REPORTS = {"a": {"test_acc": 0.03, "test_count": 1.0}, "b": {"test_acc": 0.84, "test_count": 8.0},
           "c": {"test_acc": 0.43, "test_count": 5.0}}


def _arrived(order: tuple[str, ...]) -> dict[str, dict[str, float]]:
    return {silo: REPORTS[silo] for silo in order}


def test_the_results_document_is_the_same_for_every_arrival_order() -> None:
    plan = parse_plan({"federation": {"id": "f", "algorithm": "fedavg", "rounds": 1,
                                      "silos": list(REPORTS)}}, base_dir=Path("."))
    documents = []
    for order in itertools.permutations(REPORTS):
        record = RoundRecord(1, 1, tuple(REPORTS), 10, 0.0, 1.0, _arrived(order))
        documents.append(build_results(plan, [record], mode="simulation", status="completed"))
    assert all(doc == documents[0] for doc in documents)
    # Also as JSON text: the silos are listed in name order.
    assert all(list(doc["final_metrics"]) == ["a", "b", "c"] for doc in documents)
    assert all(list(doc["rounds"][0]["metrics"]) == ["a", "b", "c"] for doc in documents)


def test_weighted_accuracy_is_the_same_for_every_arrival_order() -> None:
    values = {weighted_accuracy(_arrived(order), "test")
              for order in itertools.permutations(REPORTS)}
    assert len(values) == 1
