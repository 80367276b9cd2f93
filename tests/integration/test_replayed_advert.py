"""A silo refuses a key advert replayed from an earlier run of its federation (issue 34, finding 4).

The attack: a federation is run, then started afresh under the same id with the same silos and
certificates. A malicious coordinator relays, in the new run, a key advert a peer signed in the
old one (whose keys it may have learned since). The silo's session, told the run id on joining,
must refuse the bundle before it shares anything. Real certificates and the silo's real session;
the coordinator's relaying is what the test plays.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trellis.crypto.errors import ProtocolError
from trellis.crypto.pki import Identity, throwaway_identities
from trellis.protos.messages import Envelope, Instruction, KeyBundle, Phase, SignedKey
from trellis.protos.plan import PublicPlan, parse_plan
from trellis.silo.federation.agent import SiloAgent
from trellis.silo.federation.session import SiloSession

NAMES = ("silo-a", "silo-b", "silo-c")


@pytest.fixture(scope="module")
def identities(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Identity]:
    return throwaway_identities(list(NAMES), tmp_path_factory.mktemp("run-binding-pki"))


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> PublicPlan:
    return parse_plan({"federation": {"id": "f", "algorithm": "fedavg", "rounds": 1,
                                      "silos": list(NAMES)}},
                      base_dir=tmp_path_factory.mktemp("plan")).public


def _run(identities: dict[str, Identity], plan: PublicPlan, run_id: str
         ) -> tuple[dict[str, SiloSession], dict[str, SignedKey]]:
    """The silos of one run, joined (told run_id, as SiloAgent.join does) and advertised."""
    sessions: dict[str, SiloSession] = {}
    adverts: dict[str, SignedKey] = {}
    for name in NAMES:
        session = SiloSession(identities[name], lambda p: _FakeTrainer())
        session.accept_plan(plan.to_json())
        session.run_id = run_id
        session.open_round(Instruction(Envelope("f", 1, 1, Phase.ROUND_OPEN), NAMES))
        signed = session.advert()
        sessions[name] = session
        adverts[name] = SignedKey(name, signed.cipher_key, signed.mask_key, signed.signature,
                                  identities[name].cert_pem)
    return sessions, adverts


def test_an_advert_signed_in_an_earlier_run_is_refused_in_the_next(
        identities: dict[str, Identity], plan: PublicPlan) -> None:
    _, run_a = _run(identities, plan, "0a1b2c3d4e5f6071")
    sessions, run_b = _run(identities, plan, "8192a3b4c5d6e7f8")
    keys_ready = Envelope("f", 1, 1, Phase.KEYS_READY)
    replayed = KeyBundle(keys_ready, (run_b["silo-a"], run_a["silo-b"], run_b["silo-c"]))
    with pytest.raises(ProtocolError, match=r"key advert of 'silo-b' has an invalid signature "
                       r"for federation 'f', run '8192a3b4c5d6e7f8', round 1, attempt 1"):
        sessions["silo-a"].share_keys(replayed)
    # The same silo, shown its run's own adverts, goes on: only the replay was refused.
    fresh = SiloSession(identities["silo-a"], lambda p: _FakeTrainer())
    fresh.accept_plan(plan.to_json())
    fresh.run_id = "8192a3b4c5d6e7f8"
    fresh.open_round(Instruction(Envelope("f", 1, 1, Phase.ROUND_OPEN), NAMES))
    own = fresh.advert()
    honest = KeyBundle(keys_ready, (SignedKey("silo-a", own.cipher_key, own.mask_key,
                                              own.signature, identities["silo-a"].cert_pem),
                                    run_b["silo-b"], run_b["silo-c"]))
    assert len(fresh.share_keys(honest).shares) == 2


@pytest.mark.parametrize(("run_id", "said"), [("", "no"), ("f" * 65, "an over-long")])
def test_a_silo_refuses_a_coordinator_that_tells_no_run_id(
        identities: dict[str, Identity], plan: PublicPlan, tmp_path: Path, run_id: str,
        said: str) -> None:
    """Without a run id nothing could tell this run's adverts from an earlier run's."""
    session = SiloSession(identities["silo-a"], lambda p: _FakeTrainer())
    agent = SiloAgent("127.0.0.1:1", identities["silo-a"], session, tmp_path, log=lambda m: None)
    try:
        with pytest.raises(ProtocolError, match=f"the coordinator told {said} run id on joining"):
            agent.join(Instruction(Envelope("", 0, 0, Phase.JOIN),
                                   public_plan_json=plan.to_json(), run_id=run_id))
    finally:
        agent.audit.close()
    assert session.run_id == ""


class _FakeTrainer:
    """Stands in for the ML side: the session only needs its shared-vector length here."""

    class layout:  # noqa: N801
        length = 4

    def snapshot(self) -> dict:
        return {}
