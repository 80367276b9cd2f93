"""What the coordinator projects for a private plan (coordinator/rounds/privacy_report.py):
with summed evaluation counts, their releases are in its epsilon as each silo's ledger has them."""

from __future__ import annotations

from pathlib import Path

import pytest

from trellis.coordinator.rounds.privacy_report import (
    design_epsilon,
    privacy_lines,
    privacy_summary,
    round_privacy,
)
from trellis.protos.plan import Plan, parse_plan
from trellis.silo.privacy.budget import SiloBudget

SILOS = ["a", "b", "c", "d", "e"]
SUMMED = {"aggregate": True, "noise_multiplier": 20.0, "classes": 2}


def _plan(metrics: dict | None = None, rounds: int = 20) -> Plan:
    raw: dict = {"federation": {"id": "f", "algorithm": "fedstar", "rounds": rounds,
                                "silos": SILOS},
                 "privacy": {"mechanism": "ddg", "noise_multiplier": 1.0, "batch": 16,
                             "design_graphs": 200, "bits": 16}}
    if metrics is not None:
        raw["metrics"] = metrics
    return parse_plan(raw, base_dir=Path("."))


def test_the_projection_holds_the_summed_counts_as_a_silo_accounts_them() -> None:
    plain, summed = _plan(), _plan(SUMMED)
    assert design_epsilon(summed, 20) > design_epsilon(plain, 20)
    # A silo of the design size projects the same (it knows its dimension, which under the
    # plan's pld accountant moves only the slack of order 1e-30).
    silo = SiloBudget(summed.public, None, graphs=200, dimension=1, shared_values=1)
    assert design_epsilon(summed, 20) == pytest.approx(silo.projected_epsilon(), rel=1e-6)
    assert "summed evaluation counts included" in " ".join(privacy_lines(summed))
    assert "summed evaluation counts" not in " ".join(privacy_lines(plain))
    assert privacy_summary(summed)["privacy"]["projected_epsilon"] == pytest.approx(
        design_epsilon(summed, 20), abs=1e-6)


def test_a_round_record_holds_the_counts_of_the_rounds_done_not_the_final_attempt() -> None:
    summed = _plan(SUMMED)
    done = round_privacy(summed, 5, survivors=5)["privacy"]["design_epsilon"]
    assert done == pytest.approx(design_epsilon(summed, 5, final_counts=False), abs=1e-6)
    assert done < design_epsilon(summed, 5)
