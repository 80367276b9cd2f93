"""A plan's [data] reference_sha256 against the silo's dataset: `silo join`'s session and a
standing silo's job approval refuse a mismatch, naming both hashes, before anything is sent."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.jobs import DATASET, JobFederation, public_plan, signed_offer
from trellis.crypto.pki import Identity, throwaway_identities
from trellis.protos.plan import PublicPlan
from trellis.silo.data.molecules.dataset_check import (
    DatasetMismatch,
    dataset_fingerprint,
    reference_problem,
)
from trellis.silo.federation.session import SiloSession
from trellis.silo.jobs.approval import evaluate_offer
from trellis.silo.privacy.jobs_policy import JobsPolicy
from trellis.silo.privacy.policy import Policy

OURS = "a" * 64
THEIRS = "b" * 64


def _prepared(folder: Path, fingerprint: str) -> Path:
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"format": "trellis-prepared/1",
                                                      "fingerprint": fingerprint}))
    return folder


def test_dataset_fingerprint_reads_the_manifest_and_is_empty_without_one(tmp_path: Path
                                                                         ) -> None:
    assert dataset_fingerprint(_prepared(tmp_path / "p", OURS)) == OURS
    assert dataset_fingerprint(tmp_path / "tu-folder") == ""
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{not json")
    assert dataset_fingerprint(tmp_path / "broken") == ""


def test_reference_problem_names_both_hashes() -> None:
    assert reference_problem("", THEIRS, "d") == ""
    assert reference_problem(OURS, OURS, "d") == ""
    differs = reference_problem(OURS, THEIRS, "dataset 'x'")
    assert OURS in differs and THEIRS in differs and "\n" not in differs
    none = reference_problem(OURS, "", "dataset 'x'")
    assert "requires a prepared dataset with the reference-set fingerprint" in none


@pytest.fixture(scope="module")
def identity(tmp_path_factory: pytest.TempPathFactory) -> Identity:
    return throwaway_identities(["silo-a"], tmp_path_factory.mktemp("ref-pki"))["silo-a"]


def _recording(built: list[PublicPlan]) -> Callable[[PublicPlan], Any]:
    """A make_trainer that records the plans it was asked to build for (a stand-in trainer)."""

    def make(plan: PublicPlan) -> Any:
        built.append(plan)
        return object()

    return make


def _plan(reference: str) -> PublicPlan:
    return replace(public_plan(dataset=""), algorithm="fedavg", reference_sha256=reference)


@pytest.mark.parametrize(("have", "fragment"), [
    (THEIRS, f"was prepared with {THEIRS}"),
    ("", "records none"),
])
def test_join_refuses_a_plan_its_dataset_does_not_match_before_building_anything(
        identity: Identity, have: str, fragment: str) -> None:
    built: list[PublicPlan] = []
    session = SiloSession(identity, _recording(built), dataset_fingerprint=have)
    with pytest.raises(DatasetMismatch) as caught:
        session.accept_plan(_plan(OURS).to_json())
    assert OURS in str(caught.value) and fragment in str(caught.value)
    assert str(caught.value).endswith("nothing was sent")
    assert built == [] and session.plan is None


def test_join_accepts_the_matching_fingerprint_and_a_plan_requiring_none(
        identity: Identity) -> None:
    for have, plan in ((OURS, _plan(OURS)), ("", _plan(""))):
        built: list[PublicPlan] = []
        session = SiloSession(identity, _recording(built), dataset_fingerprint=have)
        session.accept_plan(plan.to_json())
        assert built == [plan]


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> JobFederation:
    return JobFederation.create(tmp_path_factory.mktemp("ref-approval"))


def test_a_job_offer_is_refused_when_the_served_dataset_does_not_match(
        federation: JobFederation, tmp_path: Path) -> None:
    alice = federation.operator("alice")
    policy = Policy(jobs=JobsPolicy(approve="auto"))
    plan = replace(public_plan(), reference_sha256=OURS)
    for folder, verdict, fragment in (
            (_prepared(tmp_path / "same", OURS), "approve", "approves it"),
            (_prepared(tmp_path / "other", THEIRS), "refuse", f"was prepared with {THEIRS}"),
            (tmp_path / "tu", "refuse", "records none")):
        decision = evaluate_offer(signed_offer(alice, plan), policy=policy,
                                  ca_pem=federation.ca_pem, datasets={DATASET: folder})
        assert decision.verdict == verdict, decision.reason
        assert fragment in decision.reason
        if verdict == "refuse":
            assert OURS in decision.reason and f"dataset {DATASET!r} ({folder})" in decision.reason
