"""The coordinator's round machine driven by real secure-aggregation clients: stages, refusals of
misplaced messages, dropouts recovered at every stage, aborts below the threshold and retries."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from trellis.coordinator.rounds.errors import Duplicate, InvalidPayload, NotParticipant, OutOfPhase
from trellis.coordinator.rounds.machine import RoundMachine, Stage
from trellis.coordinator.rounds.strategies import make_strategy
from trellis.crypto.fixedpoint import FixedPointSpec
from trellis.crypto.keyagreement import KeyAdvert
from trellis.crypto.pki import Identity, throwaway_identities
from trellis.crypto.secagg import RelayedAdvert
from trellis.crypto.secagg_client import SecAggClient
from trellis.protos.messages import (
    Envelope,
    KeyAdvertisement,
    MetricsReport,
    Phase,
    SealedShares,
    SignedSurvivors,
)
from trellis.protos.plan import parse_plan

SILOS = ["a", "b", "c"]
LENGTH = 3


@pytest.fixture(scope="module")
def ids(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Identity]:
    return throwaway_identities(SILOS, tmp_path_factory.mktemp("rounds-pki"))


class Driver:
    """Plays the silos' side of each stage with real clients (no training, fixed vectors)."""

    def __init__(self, ids: dict[str, Identity], rounds: int = 2, min_silos: int = 2,
                 max_attempts: int = 3, attempts_before: int = 0) -> None:
        plan = parse_plan({
            "federation": {"id": "f", "algorithm": "fedavg", "rounds": rounds, "silos": SILOS,
                           "min_silos": min_silos},
            "timeouts": {"join_s": 10, "round_s": 5, "stage_s": 4, "report_s": 3,
                         "max_attempts": max_attempts},
        }, base_dir=Path("."))
        self.ids = ids
        self.m = RoundMachine(plan, make_strategy("fedavg"), now=0.0,
                              attempts_before=attempts_before)
        self.spec = FixedPointSpec(64.0, 24)
        self.clients: dict[str, SecAggClient] = {}

    def env(self, phase: Phase) -> Envelope:
        return Envelope("f", self.m.round, self.m.attempt, phase)

    def join_all(self) -> None:
        for s in SILOS:
            self.m.join(s, self.ids[s].cert_pem, 0.0)

    def advert(self, s: str, length: int = LENGTH) -> KeyAdvertisement:
        client = SecAggClient(s, self.m.context(), self.m.secagg_config, self.ids[s].key_pem,
                              self.ids[s].ca_pem)
        self.clients[s] = client
        signed = client.advert()
        return KeyAdvertisement(self.env(Phase.ADVERTISE_KEY), signed.cipher_key,
                                signed.mask_key, signed.signature, length)

    def advertise(self, names: list[str]) -> None:
        for s in names:
            self.m.advertise(s, self.advert(s), 1.0)

    def share(self, names: list[str]) -> None:
        for s in names:
            bundle = self.m.key_bundle(s, self.env(Phase.KEYS_READY))
            relayed = [RelayedAdvert(KeyAdvert(k.silo, k.cipher_key, k.mask_key, k.signature),
                                     k.certificate_pem) for k in bundle.keys]
            sealed = self.clients[s].share_keys(relayed)
            self.m.upload_shares(s, SealedShares(self.env(Phase.SHARE_KEYS), tuple(sealed)), 1.0)

    def masked(self, s: str, value: float) -> np.ndarray:
        received = self.m.shares_for(s, self.env(Phase.SHARES_READY)).shares
        return self.clients[s].mask_input(self.spec.encode(np.full(LENGTH, value), 10), received)

    def inputs(self, values: dict[str, float]) -> None:
        for s, value in values.items():
            self.m.masked_input(s, self.env(Phase.MASKED_INPUT), self.masked(s, value), 2.0)

    def sign(self, names: list[str]) -> None:
        for s in names:
            survivors = self.m.instruction(s).participants
            signature = self.clients[s].sign_survivors(survivors)
            self.m.sign_survivors(s, SignedSurvivors(self.env(Phase.SIGN_SURVIVORS), signature),
                                  2.0)

    def reveal(self, names: list[str]) -> None:
        for s in names:
            if self.m.stage is not Stage.UNMASK:
                return                   # enough shares arrived: the round is already done
            request = self.m.unmask_request(s, self.env(Phase.UNMASK)).request
            self.m.reveal_shares(s, self.env(Phase.REVEAL_SHARES),
                                 tuple(self.clients[s].reveal(request)), 2.0)

    def full_round(self, values: dict[str, float]) -> None:
        names = sorted(values)
        self.advertise(names)
        self.share(names)
        self.inputs(values)
        self.sign(names)
        self.reveal(names)


def test_full_run_aggregates_weighted_mean_and_finishes(ids) -> None:
    d = Driver(ids)
    d.join_all()
    m = d.m
    assert m.stage is Stage.ADVERTISE and m.participants == tuple(SILOS)
    assert m.instruction("a").envelope.phase is Phase.ROUND_OPEN
    d.advertise(SILOS)
    assert m.stage is Stage.SHARE and m.instruction("a").envelope.phase is Phase.KEYS_READY
    assert [k.silo for k in m.key_bundle("a", d.env(Phase.KEYS_READY)).keys] == SILOS
    d.share(SILOS)
    assert m.stage is Stage.INPUT and m.instruction("b").envelope.phase is Phase.SHARES_READY
    d.inputs({"a": 1.0, "b": 2.0, "c": 3.0})
    assert m.instruction("c").envelope.phase is Phase.CONSISTENCY_CHECK
    assert m.instruction("c").participants == tuple(SILOS)
    d.sign(SILOS)
    assert m.instruction("c").envelope.phase is Phase.UNMASK
    d.reveal(SILOS[:2])               # two of three reveals are enough at threshold 2
    assert m.round == 2 and m.stage is Stage.ADVERTISE
    assert np.allclose(m.global_state, 2.0)
    d.full_round({"a": 0.0, "b": 0.0, "c": 3.0})
    assert m.stage is Stage.FINISHING
    assert m.instruction("b").envelope.phase is Phase.FINISHED
    for s in SILOS:
        m.report(s, MetricsReport(Envelope("f", 2, 0, Phase.REPORT), {"test_acc": 0.5}), 3.0)
    assert m.stage is Stage.DONE


def test_misplaced_messages_are_refused_without_changing_state(ids) -> None:
    d = Driver(ids)
    d.join_all()
    m = d.m
    good = d.advert("a")
    with pytest.raises(OutOfPhase, match="expected phase ADVERTISE_KEY"):
        m.advertise("a", replace(good, envelope=d.env(Phase.MASKED_INPUT)), 0.0)
    with pytest.raises(OutOfPhase, match="round 7"):
        m.advertise("a", replace(good, envelope=replace(good.envelope, round=7)), 0.0)
    with pytest.raises(OutOfPhase, match="federation"):
        m.advertise("a", replace(good, envelope=replace(good.envelope, federation="g")), 0.0)
    with pytest.raises(NotParticipant):
        m.advertise("zed", good, 0.0)
    with pytest.raises(InvalidPayload, match="32-byte"):
        m.advertise("a", replace(good, mask_key=b"short"), 0.0)
    m.advertise("a", good, 0.0)
    with pytest.raises(Duplicate, match="already answered"):
        m.advertise("a", good, 0.0)
    with pytest.raises(InvalidPayload, match="shared vector of 4"):
        m.advertise("b", d.advert("b", length=4), 0.0)
    with pytest.raises(OutOfPhase):       # masked input before its stage
        m.masked_input("a", d.env(Phase.MASKED_INPUT), np.zeros(4, np.uint64), 0.0)
    with pytest.raises(OutOfPhase):       # shares before their stage
        m.upload_shares("a", SealedShares(d.env(Phase.SHARE_KEYS), ()), 0.0)
    assert m.stage is Stage.ADVERTISE and m.secagg is not None
    assert set(m.secagg.servers[0].adverts) == {"a"}


def test_wrong_payloads_and_replays_refused(ids) -> None:
    d = Driver(ids)
    d.join_all()
    d.advertise(SILOS)
    with pytest.raises(InvalidPayload, match="exactly one share"):
        d.m.upload_shares("a", SealedShares(d.env(Phase.SHARE_KEYS), ()), 1.0)
    d.share(SILOS)
    env = d.env(Phase.MASKED_INPUT)
    with pytest.raises(InvalidPayload, match="shape"):
        d.m.masked_input("a", env, np.zeros(9, np.uint64), 1.0)
    with pytest.raises(InvalidPayload, match="uint64"):
        d.m.masked_input("a", env, np.zeros(4, np.float32), 1.0)
    masked = d.masked("a", 1.0)
    d.m.masked_input("a", env, masked, 1.0)
    with pytest.raises(Duplicate):
        d.m.masked_input("a", env, masked, 1.0)
    with pytest.raises(InvalidPayload, match="signature over the survivor list is invalid"):
        d.inputs({"b": 1.0, "c": 1.0})
        d.m.sign_survivors("a", SignedSurvivors(d.env(Phase.SIGN_SURVIVORS), b"forged"), 2.0)


@pytest.mark.parametrize("stage", ["advertise", "share", "input", "consistency", "unmask"])
def test_a_silo_vanishing_at_any_stage_is_recovered_from(ids, stage: str) -> None:
    d = Driver(ids)
    d.join_all()
    m = d.m
    values = {"a": 1.0, "b": 2.0, "c": 6.0}
    order = ["advertise", "share", "input", "consistency", "unmask"]
    live = list(SILOS)
    for step in order:
        if step == stage:
            events = m.leave("c", 1.5)
            assert events[0].kind == "silo_left"
            live = ["a", "b"]
        {"advertise": d.advertise, "share": d.share,
         "input": lambda names: d.inputs({s: values[s] for s in names}),
         "consistency": d.sign, "unmask": d.reveal}[step](
            [s for s in live if s in (m.secagg.expected() if m.secagg else ())])
        if m.round == 2:
            break
    assert m.round == 2 and m.history[0].attempts == 1
    contributed = ["a", "b"] if stage in ("advertise", "share", "input") else SILOS
    assert m.history[0].participants == tuple(contributed)
    expected = sum(values[s] for s in contributed) / len(contributed)
    assert np.allclose(m.global_state, expected)


def test_too_few_survivors_abort_with_the_reason_and_retry(ids) -> None:
    d = Driver(ids)
    d.join_all()
    m = d.m
    d.advertise(SILOS)
    d.share(SILOS)
    d.inputs({"a": 1.0})
    events = m.tick(1.0 + 5.0)               # b and c stay silent past round_s
    kinds = [e.kind for e in events]
    assert kinds[:2] == ["deadline_passed", "round_aborted"]
    assert events[0].fields["silent"] == ["b", "c"]
    assert "masked input" in events[1].fields["reason"]
    assert "threshold is 2" in events[1].fields["reason"]
    assert m.stage is Stage.WAITING            # b and c sit out the retry: only a is eligible
    m.tick(100.0)
    assert m.stage is Stage.ADVERTISE and m.attempt == 2 and m.participants == tuple(SILOS)


def test_deadline_and_join_failures(ids) -> None:
    d = Driver(ids, min_silos=3)
    d.m.join("a", ids["a"].cert_pem, 0.0)
    assert d.m.tick(11.0)[-1].kind == "federation_failed"
    assert "only 1 of the 3" in d.m.failure


def test_attempt_limit_fails_the_federation(ids) -> None:
    d = Driver(ids, max_attempts=1)
    d.join_all()
    d.advertise(SILOS)
    d.share(SILOS)
    d.m.leave("a", 1.0)
    d.m.leave("b", 1.0)
    assert d.m.stage is Stage.FAILED and "failed 1 attempts" in d.m.failure
    assert d.m.instruction("c").envelope.phase is Phase.ROUND_ABORTED


def test_a_restarted_coordinator_numbers_attempts_after_the_old_ones(ids) -> None:
    """Attempts opened before a restart keep their numbers; only the new ones count."""
    d = Driver(ids, max_attempts=1, attempts_before=3)
    d.join_all()
    assert d.m.round == 1 and d.m.attempt == 4     # not 1: old keys must not match
    d.full_round({s: 1.0 for s in SILOS})
    assert d.m.history[0].attempts == 4
    assert d.m.round == 2 and d.m.attempt == 1     # the next round numbers from 1 again
    d.advertise(SILOS)
    d.share(SILOS)
    d.m.leave("a", 1.0)
    d.m.leave("b", 1.0)
    # One attempt failed in round 2: max_attempts = 1 ends the federation there, however many
    # attempts round 1 had before the restart.
    assert d.m.stage is Stage.FAILED and "failed 1 attempts" in d.m.failure


def test_unadmitted_silo_and_early_reports_refused(ids) -> None:
    d = Driver(ids)
    with pytest.raises(NotParticipant):
        d.m.join("mallory", b"cert", 0.0)
    d.join_all()
    with pytest.raises(OutOfPhase, match="has not completed"):
        d.m.report("a", MetricsReport(Envelope("f", 1, 0, Phase.REPORT), {"x": 1.0}), 0.0)


def _signed_round(d: Driver, values: dict[str, float]) -> Envelope:
    """Advertise, share, mask and sign among these silos; the envelope of their UNMASK."""
    names = sorted(values)
    d.advertise(names)
    d.share(names)
    d.inputs(values)
    d.sign(names)
    return d.env(Phase.UNMASK)


def test_a_share_reveal_after_unmasking_closed_is_recorded_as_late_not_refused(ids) -> None:
    """Unmasking needs only a threshold of reveals, so the slowest survivor's comes after the
    round moved on: routine in a healthy run. Before, it was refused as out of phase (counted
    as a refusal, and its silo logged that the round "went on without" it)."""
    d = Driver(ids, rounds=3)
    d.join_all()
    m = d.m
    unmask = _signed_round(d, {"a": 1.0, "b": 2.0, "c": 3.0})
    asked = m.unmask_request("c", unmask).request     # c asked in time ...
    d.reveal(["a", "b"])                               # ... but two reveals were enough
    assert m.round == 2 and m.stage is Stage.ADVERTISE
    shares = tuple(d.clients["c"].reveal(asked))
    late = replace(unmask, phase=Phase.REVEAL_SHARES)
    events = m.reveal_shares("c", late, shares, 3.0)
    assert [(e.kind, e.fields) for e in events] == [
        ("late_reveal", {"silo": "c", "round": 1, "attempt": 1, "count": len(shares)})]
    assert m.round == 2 and m.stage is Stage.ADVERTISE and np.allclose(m.global_state, 2.0)
    with pytest.raises(Duplicate, match="already revealed"):
        m.reveal_shares("c", late, shares, 3.0)
    with pytest.raises(OutOfPhase):                    # a's reveal counted in time
        m.reveal_shares("a", late, shares, 3.0)
    with pytest.raises(OutOfPhase):                    # not a reveal of that attempt
        m.reveal_shares("c", replace(late, attempt=2), shares, 3.0)

    # Round 2: the slowest asks what to reveal only after the round is over; it is told.
    unmask = _signed_round(d, {"a": 1.0, "b": 1.0, "c": 1.0})
    d.reveal(["b", "c"])
    assert m.round == 3
    asked = m.unmask_request("a", unmask).request
    assert asked.survivors == tuple(SILOS)
    late = replace(unmask, phase=Phase.REVEAL_SHARES)
    with pytest.raises(InvalidPayload, match="other shares than it was asked for"):
        m.reveal_shares("a", late, (), 4.0)
    events = m.reveal_shares("a", late, tuple(d.clients["a"].reveal(asked)), 4.0)
    assert [e.kind for e in events] == ["late_reveal"] and m.round == 3


def test_metrics_are_accepted_only_from_the_rounds_participants(ids) -> None:
    """A silo that was out of a round (it left, and came back restarted) reported metrics for
    it, and the coordinator recorded them, even as the silo's final metrics."""
    from trellis.coordinator.rounds.machine import per_silo_final_metrics

    d = Driver(ids, rounds=2)
    d.join_all()
    m = d.m
    d.advertise(SILOS)
    d.share(SILOS)
    m.leave("c", 1.5)                                 # c's process dies before its input
    d.inputs({"a": 1.0, "b": 2.0})
    d.sign(["a", "b"])
    d.reveal(["a", "b"])
    assert m.history[0].participants == ("a", "b") and m.round == 2
    m.join("c", ids["c"].cert_pem, 2.0)               # restarted: round 2 opened without it

    def report(silo: str, round_no: int) -> list:
        return m.report(silo, MetricsReport(Envelope("f", round_no, 0, Phase.REPORT),
                                            {"test_acc": 0.9}), 3.0)

    with pytest.raises(NotParticipant, match="c did not take part in round 1"):
        report("c", 1)
    assert [e.kind for e in report("a", 1)] == ["metrics"]
    assert set(m.history[0].metrics) == {"a"}
    d.full_round({"a": 1.0, "b": 1.0})
    assert m.stage is Stage.FINISHING and m.history[1].participants == ("a", "b")
    with pytest.raises(NotParticipant, match="c did not take part in round 2"):
        report("c", 2)                                # the final report of a silo left out
    report("a", 2)
    report("b", 2)
    assert m.stage is Stage.DONE
    assert set(per_silo_final_metrics(m.history)) == {"a", "b"}


def test_a_jobs_machine_admits_and_waits_for_its_approvers_only(ids: dict[str, Identity]
                                                                 ) -> None:
    """A job two of three silos approved: round 1 opens with those two, the third is refused."""
    d = Driver(ids)
    d.m.expect_only(["a", "b"])
    d.m.join("a", ids["a"].cert_pem, 0.0)
    assert d.m.stage is Stage.WAITING
    with pytest.raises(NotParticipant, match="did not approve this job"):
        d.m.join("c", ids["c"].cert_pem, 0.0)
    d.m.join("b", ids["b"].cert_pem, 0.0)
    assert d.m.stage is not Stage.WAITING and d.m.round == 1
    with pytest.raises(ValueError, match="some of the plan's silos"):
        d.m.expect_only(["a", "z"])


def test_stopping_a_machine_fails_it_once_with_the_reason(ids: dict[str, Identity]) -> None:
    d = Driver(ids)
    d.join_all()
    events = d.m.stop("stopped by ops-alice: wrong dataset")
    assert d.m.stage is Stage.FAILED and d.m.failure == "stopped by ops-alice: wrong dataset"
    assert [e.kind for e in events] == ["federation_failed"]
    assert d.m.stop("again") == []
