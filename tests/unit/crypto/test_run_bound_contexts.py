"""Every signed protocol context is bound to the run (issue 34, finding 4).

A federation id is chosen by its operator and reused when the federation is started afresh; the
run id the coordinator draws at a fresh start is what tells two runs apart. Here, with real
certificates and the real client and server objects: a key advert or a survivor signature made
in run A of a federation, presented in run B of the same federation by the same silos, is
refused by the silo and by the coordinator, with the run named in the error.
"""

from __future__ import annotations

import numpy as np
import pytest

from trellis.crypto.errors import ProtocolError
from trellis.crypto.keyagreement import (
    EphemeralKeyPair,
    RoundContext,
    make_advert,
    verify_advert,
)
from trellis.crypto.pki import Identity, throwaway_identities
from trellis.crypto.secagg import RelayedAdvert, SecAggConfig
from trellis.crypto.secagg_client import SecAggClient
from trellis.crypto.secagg_server import SecAggServer

RUN_A = RoundContext("fed", 1, 1, run="0a1b2c3d4e5f6071")
RUN_B = RoundContext("fed", 1, 1, run="8192a3b4c5d6e7f8")    # same federation, round, attempt


@pytest.fixture(scope="module")
def identities(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Identity]:
    return throwaway_identities(["silo-0", "silo-1", "silo-2"],
                                tmp_path_factory.mktemp("run-binding-pki"))


class _Run:
    """Three silos of one run taken by hand to the stage where they signed the survivors (or,
    with sign=False, to where the coordinator waits for those signatures)."""

    def __init__(self, identities: dict[str, Identity], context: RoundContext,
                 sign: bool = True) -> None:
        self.names = sorted(identities)
        self.certificates = {s: identities[s].cert_pem for s in self.names}
        self.server = SecAggServer(context, SecAggConfig(2), self.names, 3, np.uint64)
        self.clients = {s: SecAggClient(s, context, SecAggConfig(2), identities[s].key_pem,
                                        identities[s].ca_pem) for s in self.names}
        self.adverts = {s: c.advert() for s, c in self.clients.items()}
        for s in self.names:
            self.server.add_advert(s, self.adverts[s], self.certificates[s])
        self.server.close_stage()
        for s, c in self.clients.items():
            self.server.add_shares(s, c.share_keys(self.server.relayed_adverts()))
        self.server.close_stage()
        for s, c in self.clients.items():
            self.server.add_masked_input(s, c.mask_input(np.ones(3, np.uint64),
                                                         self.server.shares_for(s)))
        self.server.close_stage()
        if not sign:
            return
        self.survivor_signatures = {s: self.clients[s].sign_survivors(self.server.survivors)
                                    for s in self.server.survivors}
        for s, signature in self.survivor_signatures.items():
            self.server.add_signature(s, signature)
        self.server.close_stage()


def test_a_key_advert_of_another_run_is_refused_by_silo_and_coordinator(
        identities: dict[str, Identity]) -> None:
    """The replay a malicious coordinator would try: silo-1's advert of run A relayed in run B."""
    old = _Run(identities, RUN_A).adverts["silo-1"]
    silo_1 = identities["silo-1"]
    with pytest.raises(ProtocolError, match=r"key advert of 'silo-1' has an invalid signature "
                       r"for federation 'fed', run '8192a3b4c5d6e7f8', round 1, attempt 1: "
                       r"forged, or signed for another run"):
        verify_advert(old, silo_1.cert_pem, silo_1.ca_pem, RUN_B)
    # The silo of run B is shown the old advert in its key bundle: it shares nothing.
    me = SecAggClient("silo-0", RUN_B, SecAggConfig(2), identities["silo-0"].key_pem,
                      identities["silo-0"].ca_pem)
    bundle = [RelayedAdvert(me.advert(), identities["silo-0"].cert_pem),
              RelayedAdvert(old, silo_1.cert_pem)]
    with pytest.raises(ProtocolError, match="run '8192a3b4c5d6e7f8'"):
        me.share_keys(bundle)
    # ... and the coordinator of run B refuses it on upload too.
    server = SecAggServer(RUN_B, SecAggConfig(2), sorted(identities), 3, np.uint64)
    with pytest.raises(ProtocolError, match="not signed by its certificate for federation "
                       "'fed', run '8192a3b4c5d6e7f8'"):
        server.add_advert("silo-1", old, silo_1.cert_pem)


def test_survivor_signatures_of_another_run_do_not_count(
        identities: dict[str, Identity]) -> None:
    """Run A's consistency signatures over the same list cannot unlock shares in run B."""
    run_a, run_b = _Run(identities, RUN_A), _Run(identities, RUN_B)
    assert run_a.server.survivors == run_b.server.survivors
    with pytest.raises(ProtocolError, match="signature over the survivor list is invalid for "
                       "federation 'fed', run '8192a3b4c5d6e7f8'"):
        _Run(identities, RUN_B, sign=False).server.add_signature(
            "silo-1", run_a.survivor_signatures["silo-1"])
    honest = run_b.server.unmask_request("silo-0")
    replayed = tuple(type(item)(item.silo, run_a.survivor_signatures[item.silo])
                     for item in honest.signatures)
    request = type(honest)(honest.survivors, honest.seed_shares_of, honest.key_shares_of,
                           replayed)
    with pytest.raises(ProtocolError, match="valid consistency signatures over the survivor "
                       "list for federation 'fed', run '8192a3b4c5d6e7f8'"):
        run_b.clients["silo-0"].reveal(request)
    assert run_b.clients["silo-0"].reveal(honest)          # the run's own signatures count


def test_the_context_is_a_versioned_encoding_with_room_for_a_job(
        identities: dict[str, Identity]) -> None:
    """Run and job are fields of their own; a separator in an id cannot make two contexts alike."""
    label = RUN_A.label()
    assert label.startswith(b"trellis/context\x00\x02")
    assert b"0a1b2c3d4e5f6071" in label
    with_job = RoundContext("fed", 1, 1, run=RUN_A.run, job="job-7")
    assert with_job.label() != label and b"job-7" in with_job.label()
    assert "job 'job-7'" in with_job.describe()
    # Under the old "|"-joined label these two encoded alike.
    assert RoundContext("a|1", 1, 1, run="r").label() != RoundContext("a", 1, 1, run="1|r").label()
    silo_0 = identities["silo-0"]
    advert = make_advert("silo-0", EphemeralKeyPair(), EphemeralKeyPair(), with_job,
                         silo_0.key_pem)
    verify_advert(advert, silo_0.cert_pem, silo_0.ca_pem, with_job)
    with pytest.raises(ProtocolError, match="invalid signature"):
        verify_advert(advert, silo_0.cert_pem, silo_0.ca_pem, RUN_A)
