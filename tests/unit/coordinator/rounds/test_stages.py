"""The round machine's stage modules on their own: each sub-protocol's typed state, its refusals
and the step it hands back to the machine (tests/unit/coordinator/rounds/test_rounds.py drives them
all through the machine with real secure-aggregation clients)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from trellis.coordinator.rounds.errors import Duplicate, InvalidPayload, NotParticipant, OutOfPhase
from trellis.coordinator.rounds.machine import RoundMachine
from trellis.coordinator.rounds.stages.base import Position, Stage, check_envelope
from trellis.coordinator.rounds.stages.group_key import GroupSetup, check_setup_envelope
from trellis.coordinator.rounds.stages.secure_aggregation import Rules, SecureAggregation
from trellis.coordinator.rounds.stages.secure_aggregation import check_envelope as check_secure
from trellis.coordinator.rounds.stages.similarity import SimilarityStep
from trellis.coordinator.rounds.strategies import ClusteredStrategy, LocalStrategy, make_strategy
from trellis.crypto.fixedpoint import FixedPointSpec
from trellis.crypto.keyagreement import RoundContext
from trellis.crypto.secagg import SecAggConfig
from trellis.protos.algorithms import ALGORITHMS
from trellis.protos.messages import Envelope, Phase
from trellis.protos.plan import ClusteringConfig, parse_plan

AT = Position("f", 3, 2, Stage.SETUP_SEAL)


# -- base ------------------------------------------------------------------------------------------
def test_a_position_describes_itself_and_stamps_envelopes() -> None:
    assert AT.describe() == "round 3 attempt 2 stage setup-seal"
    assert AT.envelope(Phase.GROUP_SEAL) == Envelope("f", 3, 2, Phase.GROUP_SEAL)


def test_a_stage_message_must_match_federation_stage_round_and_phase() -> None:
    good = Envelope("f", 3, 2, Phase.GROUP_SEAL)
    check_envelope(AT, good, Stage.SETUP_SEAL, Phase.GROUP_SEAL, same_round=True)
    check_envelope(AT, replace(good, round=9), Stage.SETUP_SEAL, Phase.GROUP_SEAL,
                   same_round=False)
    for wrong, stage, text in [
        (replace(good, federation="g"), Stage.SETUP_SEAL, "does not match"),
        (replace(good, round=9), Stage.SETUP_SEAL, "does not match"),
        (good, Stage.SETUP_OPEN, "does not match the coordinator's round 3 attempt 2"),
        (replace(good, phase=Phase.GROUP_OPEN), Stage.SETUP_SEAL, "expected phase GROUP_SEAL"),
    ]:
        with pytest.raises(OutOfPhase, match=text):
            check_envelope(AT, wrong, stage, Phase.GROUP_SEAL, same_round=True)


# -- group key -------------------------------------------------------------------------------------
def test_group_setup_runs_advert_seal_open_and_says_where_it_goes() -> None:
    setup = GroupSetup.among(["c", "a", "b"])
    assert setup.silos == ("a", "b", "c") and setup.leader == "a"
    assert setup.waiting_for(Stage.SETUP_ADVERTISE) == {"a", "b", "c"}
    assert setup.add_advert("b", b"kb").enter is None
    with pytest.raises(Duplicate):
        setup.add_advert("b", b"again")
    with pytest.raises(InvalidPayload, match="empty setup key"):
        setup.add_advert("c", b"")
    with pytest.raises(NotParticipant, match="not part of the group-key setup"):
        setup.add_advert("zed", b"k")
    setup.add_advert("c", b"kc")
    step = setup.add_advert("a", b"ka")
    assert step.enter is Stage.SETUP_SEAL and not step.finished
    assert [e.kind for e in step.events] == ["setup_key", "stage_closed"]
    assert step.events[-1].fields == {"round": 0, "stage": "setup-seal"}

    certificates = {"a": b"cert-a", "b": b"cert-b"}
    with pytest.raises(NotParticipant, match="not the group-key leader"):
        setup.bundle("b", certificates)
    assert setup.bundle("a", certificates) == {"b": (b"kb", b"cert-b"), "c": (b"kc", b""),
                                               "a": (b"ka", b"cert-a")}
    with pytest.raises(InvalidPayload, match="one box for each of"):
        setup.seal("a", {"b": b"box"}, b"", needs_ckks=False)
    with pytest.raises(InvalidPayload, match="CKKS context from a refused"):
        setup.seal("a", {"b": b"box-b", "c": b"box-c"}, b"not a context", needs_ckks=True)
    assert setup.boxes == {} and setup.opened == set()      # nothing taken in
    step = setup.seal("a", {"b": b"box-b", "c": b"box-c"}, b"public", needs_ckks=False)
    assert step.enter is Stage.SETUP_OPEN and setup.opened == {"a"}

    assert setup.box("c", certificates) == (b"box-c", b"ka", b"cert-a")
    with pytest.raises(NotParticipant, match="no sealed group secrets for a"):
        setup.box("a", certificates)
    assert setup.open("b").events[0].kind == "group_opened" and not setup.complete
    with pytest.raises(Duplicate):
        setup.open("b")
    step = setup.open("c")
    assert step.finished and step.enter is None and setup.complete
    assert step.events[-1].kind == "group_ready"


def test_a_complete_group_setup_survives_a_restart() -> None:
    setup = GroupSetup(("a", "b"), "a", opened={"a", "b"}, public_context=b"ctx")
    doc, arrays = setup.durable_state()
    restored = GroupSetup.restore(doc, arrays["public_context"])
    assert (restored.silos, restored.leader, restored.public_context) == (("a", "b"), "a", b"ctx")
    assert restored.complete and restored.started(4).fields["generation"] == 4


def test_a_setup_message_must_carry_the_setup_run() -> None:
    at = Position("f", 1, 0, Stage.SETUP_ADVERTISE)
    env = Envelope("f", 0, 2, Phase.GROUP_SETUP)
    check_setup_envelope(at, env, Stage.SETUP_ADVERTISE, 2)
    with pytest.raises(OutOfPhase, match="is not from group-key setup run 3"):
        check_setup_envelope(at, env, Stage.SETUP_ADVERTISE, 3)


# -- secure aggregation ----------------------------------------------------------------------------
def _attempt(rules: Rules, participants: tuple[str, ...] = ("a", "b", "c")) -> SecureAggregation:
    return SecureAggregation(RoundContext("f", 1, 1, run="r"), participants, [participants],
                             rules, 3)


def _rules(**changes: object) -> Rules:
    rules = Rules("fedavg", FixedPointSpec(64.0, 24), SecAggConfig(2), clustered=False,
                  unweighted_sum=False, envelope_bytes=0)
    return replace(rules, **changes)  # type: ignore[arg-type]


def test_the_upload_length_holds_the_weight_and_gcfl_uploads_twice() -> None:
    assert _rules().upload_length(10) == 11
    assert _rules(unweighted_sum=True).upload_length(10) == 22
    assert _attempt(_rules()).groups.length == 4


def test_a_secure_message_is_checked_in_order_federation_phase_position() -> None:
    at = Position("f", 1, 1, Stage.INPUT)
    env = Envelope("f", 1, 1, Phase.MASKED_INPUT)
    check_secure(at, env, Stage.INPUT, Phase.MASKED_INPUT)
    with pytest.raises(OutOfPhase, match="message for federation 'g'; this is 'f'"):
        check_secure(at, replace(env, federation="g", phase=Phase.REPORT), Stage.INPUT,
                     Phase.MASKED_INPUT)
    with pytest.raises(OutOfPhase, match="expected phase MASKED_INPUT, got REPORT"):
        check_secure(at, replace(env, round=7, phase=Phase.REPORT), Stage.INPUT,
                     Phase.MASKED_INPUT)
    with pytest.raises(OutOfPhase, match="does not match the coordinator's round 1 attempt 1"):
        check_secure(at, env, Stage.SHARE, Phase.MASKED_INPUT)


def test_an_attempt_in_which_everybody_is_silent_asks_to_be_aborted() -> None:
    attempt = _attempt(_rules())
    assert attempt.stage is Stage.ADVERTISE and attempt.waiting_for() == {"a", "b", "c"}
    assert attempt.instruction("b", 5) is not None and attempt.instruction("zed", 5) is None
    assert attempt.pending_envelopes == {} and attempt.participants == ("a", "b", "c")
    events = attempt.expire()
    assert events[0].kind == "deadline_passed" and events[0].fields["silent"] == ["a", "b", "c"]
    assert attempt.late == {"a", "b", "c"} and attempt.instruction("b", 5) is None
    closing = attempt.advance(deadline_passed=True)
    assert closing.abort is not None and "threshold is 2" in closing.abort
    assert (closing.closed, closing.entered, closing.aggregate, closing.events) == (
        0, None, None, [])


def test_an_attempt_refuses_what_its_algorithm_does_not_exchange() -> None:
    attempt = _attempt(_rules())
    with pytest.raises(NotParticipant, match="does not take part in stage advertise of round 1 "
                                             "attempt 1 stage advertise"):
        attempt.advertise("zed", None, b"")     # type: ignore[arg-type]
    with pytest.raises(InvalidPayload, match="fedavg exchanges none"):
        attempt.sealed_envelope("a", b"x")
    hgn = _attempt(_rules(algorithm="fedhgn", envelope_bytes=4))
    with pytest.raises(InvalidPayload, match="must be exactly 4 bytes"):
        hgn.sealed_envelope("a", b"12345")
    assert hgn.sealed_envelope("a", b"1234")[0].fields["bytes"] == 4
    assert hgn.pending_envelopes == {"a": b"1234"}
    assert attempt._check_statistics("a", None) == {}
    with pytest.raises(InvalidPayload, match="fedavg does not use any"):
        attempt._check_statistics("a", {"update_norm": 1.0})
    gcfl = _attempt(_rules(algorithm="gcfl", clustered=True))
    assert gcfl._check_statistics("a", {"update_norm": 1, "grad_norm": 2.5}) == {
        "update_norm": 1.0, "grad_norm": 2.5}
    with pytest.raises(InvalidPayload, match="exactly the statistics update_norm, grad_norm"):
        gcfl._check_statistics("a", {"update_norm": 1.0})
    with pytest.raises(InvalidPayload, match="finite and non-negative"):
        gcfl._check_statistics("a", {"update_norm": -1.0, "grad_norm": float("nan")})


# -- similarity ------------------------------------------------------------------------------------
def test_a_split_asks_only_present_silos_of_clusters_of_two_or_more() -> None:
    assert SimilarityStep.among([("a", "b"), ("c", "d")], {"a", "c", "d"}) == SimilarityStep(
        [("c", "d")])
    assert SimilarityStep.among([("a", "b")], {"a"}) is None


def test_a_refused_blinding_skips_the_split_and_ends_the_step() -> None:
    step = SimilarityStep([("a", "b")])
    assert step.waiting_for(Stage.SIMILARITY) == {"a", "b"}
    with pytest.raises(NotParticipant):
        step.encrypted_update(4, "c", [b"x"], b"", {"a", "b"})
    with pytest.raises(InvalidPayload, match="empty encrypted update"):
        step.encrypted_update(4, "a", [], b"", {"a", "b"})
    assert step.encrypted_update(4, "a", [b"x"], b"", {"a", "b"}).enter is None
    with pytest.raises(Duplicate):
        step.encrypted_update(4, "a", [b"x"], b"", {"a", "b"})
    done = step.encrypted_update(4, "b", [b"y"], b"not a context", {"a", "b"})
    assert done.finished and done.enter is None
    assert [e.kind for e in done.events] == ["encrypted_update", "split_skipped"]


def test_decrypted_similarities_cut_the_cluster_through_the_strategy() -> None:
    silos = ("a", "b", "c", "d")
    strategy = make_strategy("gcfl", ClusteringConfig(), silos)
    assert isinstance(strategy, ClusteredStrategy)
    cosine = {("a", "b"): 0.9, ("a", "c"): -0.8, ("a", "d"): -0.7, ("b", "c"): -0.9,
              ("b", "d"): -0.6, ("c", "d"): 0.95}
    step = SimilarityStep([silos], offsets={p: 10.0 for p in cosine}, decryptor="a")
    assert step.waiting_for(Stage.DECRYPT) == {"a"}
    with pytest.raises(NotParticipant, match="not the decrypting silo"):
        step.decrypt_request("b")
    with pytest.raises(InvalidPayload, match="expected 6 decrypted values"):
        step.decrypted(21, "a", {("a", "b"): 10.9}, strategy)
    done = step.decrypted(21, "a", {p: v + 10.0 for p, v in cosine.items()}, strategy)
    assert done.finished and [e.kind for e in done.events] == ["clusters"]
    assert sorted(strategy.state.clusters) == [("a", "b"), ("c", "d")]


# -- the machine's typed reference to the clustering strategy --------------------------------------
def test_the_machine_reaches_the_cluster_hooks_without_a_down_cast() -> None:
    plan = parse_plan({"federation": {"id": "f", "algorithm": "gcfl", "rounds": 2,
                                      "silos": ["a", "b"]}}, base_dir=Path("."))
    assert make_strategy("fedavg").clustering() is None
    gcfl = make_strategy("gcfl", ClusteringConfig(), ("a", "b"))
    assert gcfl.clustering() is gcfl
    assert RoundMachine(plan, gcfl, 0.0).clusters is gcfl
    with pytest.raises(TypeError, match="disagree on clustering silos"):
        RoundMachine(plan, LocalStrategy(ALGORITHMS["gcfl"]), 0.0)
