"""The silo's side of secure aggregation refuses a plan whose threshold a minority could meet.

Here rather than beside the protocol's tests in tests/unit/crypto: the silo's session needs the
silo's torch, which the coordinator's slice does not have.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from trellis.crypto.errors import ProtocolError
from trellis.crypto.pki import Identity, throwaway_identities
from trellis.protos.messages import Envelope, Instruction, KeyBundle, Phase, SignedKey
from trellis.protos.plan import PublicPlan, parse_plan
from trellis.silo.federation.session import SiloSession


@pytest.fixture(scope="module")
def identities(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Identity]:
    """Five silo identities under one throwaway certificate authority."""
    return throwaway_identities([f"silo-{i}" for i in range(5)],
                                tmp_path_factory.mktemp("session-pki"))


def test_silo_session_refuses_a_threshold_below_a_majority(identities: dict[str, Identity],
                                                           tmp_path: Path) -> None:
    """A coordinator that sends a plan with a lowered threshold gets no shares from a silo."""
    names = sorted(identities)[:5]
    plan = parse_plan({"federation": {"id": "f", "algorithm": "fedavg", "rounds": 1,
                                      "silos": names}}, base_dir=tmp_path).public
    lowered = replace(plan, aggregation=replace(plan.aggregation, threshold=2))
    sessions = {s: SiloSession(identities[s], lambda p: _FakeTrainer()) for s in names}
    ctx_env = Envelope("f", 1, 1, Phase.ROUND_OPEN)
    adverts = []
    for s, session in sessions.items():
        session.accept_plan(lowered.to_json() if s == names[0] else plan.to_json())
        session.open_round(Instruction(ctx_env, tuple(names)))
        a = session.advert()
        adverts.append(SignedKey(s, a.cipher_key, a.mask_key, a.signature,
                                 identities[s].cert_pem))
    bundle = KeyBundle(Envelope("f", 1, 1, Phase.KEYS_READY), tuple(adverts))
    with pytest.raises(ProtocolError, match="not a majority"):
        sessions[names[0]].share_keys(bundle)
    sealed = sessions[names[1]].share_keys(bundle)        # the default threshold is accepted
    assert len(sealed.shares) == 4
    assert isinstance(PublicPlan.from_json(plan.to_json()), PublicPlan)


class _FakeTrainer:
    """Stands in for the ML side: the session only needs its shared-vector length here."""

    class layout:  # noqa: N801
        length = 4

    def snapshot(self) -> dict:
        return {}


def test_a_standing_silo_refuses_a_plan_other_than_the_one_it_approved(
        identities: dict[str, Identity], tmp_path: Path) -> None:
    """`silo join --approved-plan`: the coordinator offering job N's plan and running another
    gets nothing built or sent."""
    names = sorted(identities)[:3]
    approved = parse_plan({"federation": {"id": "f", "algorithm": "fedavg", "rounds": 2,
                                          "silos": names}}, base_dir=tmp_path).public
    other = replace(approved, rounds=200)
    built: list[PublicPlan] = []
    session = SiloSession(identities[names[0]], lambda p: built.append(p) or _FakeTrainer())
    session.approved_plan_sha256 = approved.sha256()
    with pytest.raises(ProtocolError, match="other than the one this silo approved"):
        session.accept_plan(other.to_json())
    assert built == []
    session.accept_plan(approved.to_json())
    assert built == [approved]
