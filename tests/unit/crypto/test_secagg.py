"""Dropout-tolerant secure aggregation (Bonawitz et al. 2017, SecAgg+ graphs): maths and refusals.

Property tests run the real client and server objects in one process (crypto/secagg_local.py)
with real certificates, for random n, t, graphs, vector lengths and dropouts at every stage, and
compare the result with the plain sum computed independently here.
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from trellis.crypto import shamir
from trellis.crypto.errors import EncodingError, ProtocolError
from trellis.crypto.fixedpoint import FixedPointSpec
from trellis.crypto.keyagreement import RoundContext
from trellis.crypto.neighbours import neighbour_graph, share_holders
from trellis.crypto.pki import Identity, throwaway_identities
from trellis.crypto.secagg import SecAggConfig, ShareKind, TooFewSurvivors, UnmaskRequest
from trellis.crypto.secagg_client import SecAggClient
from trellis.crypto.secagg_local import STAGES, run_local_aggregation
from trellis.crypto.secagg_server import SecAggServer

CTX = RoundContext("fed", 4, 1, run="run-1")
MAX_SILOS = 9


@pytest.fixture(scope="module")
def identities(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Identity]:
    return throwaway_identities([f"silo-{i}" for i in range(MAX_SILOS)],
                                tmp_path_factory.mktemp("secagg-pki"))


# -- Shamir ------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), data=st.data())
def test_any_t_shares_reconstruct_and_fewer_do_not(n: int, data: st.DataObject) -> None:
    t = data.draw(st.integers(1, n))
    secrets = [os.urandom(32), os.urandom(8)]
    xs = list(range(1, n + 1))
    rows = shamir.split_secrets(secrets, xs, t)
    chosen = sorted(data.draw(st.permutations(range(n)))[:t])
    got = shamir.reconstruct_secrets([xs[i] for i in chosen], rows[chosen], [32, 8])
    assert got == secrets
    if t > 1:
        fewer = chosen[:-1]
        try:
            wrong = shamir.reconstruct_secrets([xs[i] for i in fewer], rows[fewer], [32, 8])
        except EncodingError:
            return                      # limbs out of range: inconsistent, also fine
        assert wrong != secrets


def test_shamir_refuses_bad_holders_and_thresholds() -> None:
    with pytest.raises(EncodingError, match="threshold"):
        shamir.split_secrets([bytes(32)], [1, 2], 3)
    with pytest.raises(EncodingError, match="distinct"):
        shamir.split_secrets([bytes(32)], [1, 1], 1)
    with pytest.raises(EncodingError, match="even"):
        shamir.split_secrets([bytes(3)], [1, 2], 1)


# -- neighbour graphs --------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 60), half=st.integers(1, 6), seed=st.integers(0, 2**31))
def test_secagg_plus_graph_is_symmetric_regular_and_public(n: int, half: int, seed: int) -> None:
    roster = tuple(sorted(f"s{i:02d}" for i in range(n)))
    k = 2 * half
    graph = neighbour_graph(roster, k, seed, CTX.label())
    assert graph == neighbour_graph(roster, k, seed, CTX.label())
    for name, peers in graph.items():
        assert name not in peers
        assert len(peers) == (n - 1 if k >= n - 1 else k)
        assert all(name in graph[p] for p in peers)
        assert share_holders(graph, name)[0] <= max(share_holders(graph, name))
    if k < n - 1 and n > 8:
        assert graph != neighbour_graph(roster, k, seed + 1, CTX.label())


def test_graph_refuses_odd_degree_and_unsorted_roster() -> None:
    with pytest.raises(ProtocolError, match="even"):
        neighbour_graph(tuple(f"s{i}" for i in range(9)), 3, 0, b"")
    with pytest.raises(ProtocolError, match="sorted"):
        neighbour_graph(("b", "a"), 0, 0, b"")


# -- the whole protocol under dropouts ----------------------------------------------------------
def _expected(names: list[str], t: int, k: int, drops: dict[str, str]
              ) -> tuple[str, ...] | None:
    """Survivors (U3) if the protocol must succeed, None if it must abort: computed from the
    protocol's definition, independently of the server's bookkeeping."""
    stage_of = {name: drops.get(name, "never") for name in names}

    def reached(stage: str) -> list[str]:
        limit = STAGES.index(stage)
        return [n for n in names if stage_of[n] == "never" or STAGES.index(stage_of[n]) > limit]

    u1 = reached("advertise")
    if len(u1) < t:
        return None
    graph = neighbour_graph(tuple(u1), k, 0, CTX.label())
    if any(len(share_holders(graph, u)) < t for u in reached("share")):
        return None
    u2 = reached("share")
    if len(u2) < t:
        return None
    for u in u2:
        if stage_of[u] != "input" and len(graph[u] & set(u2)) + 1 < t:
            return None                    # a silo refuses to mask with too few sharers
    u3 = reached("input")
    if len(u3) < t:
        return None
    u4 = reached("consistency")
    if len(u4) < t:
        return None
    u5 = set(reached("unmask"))
    for u in u2:
        if u not in u3 and not graph[u] & set(u3):
            continue
        if len(set(share_holders(graph, u)) & u5) < t:
            return None
    return tuple(u3)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_unmasked_sum_equals_plain_sum_of_survivors(identities: dict[str, Identity],
                                                   data: st.DataObject) -> None:
    n = data.draw(st.integers(2, MAX_SILOS), label="n")
    k = data.draw(st.sampled_from([0, 2, 4]), label="neighbours")
    holders = n if k == 0 or k >= n - 1 else k + 1
    t = data.draw(st.integers(1, holders), label="threshold")
    d = data.draw(st.integers(0, 40), label="d")
    ring = data.draw(st.sampled_from([32, 64]), label="ring")
    names = sorted(identities)[:n]
    drops = data.draw(st.dictionaries(st.sampled_from(names), st.sampled_from(STAGES),
                                      max_size=n), label="drops")
    spec = FixedPointSpec(clip=2.0, fraction_bits=12, ring_bits=ring, max_weight=50)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    floats = {s: rng.uniform(-3, 3, d) for s in names}
    weights = {s: int(rng.integers(1, 50)) for s in names}
    encoded = {s: spec.encode(floats[s], weights[s]) for s in names}

    outcome = run_local_aggregation(encoded, {s: identities[s] for s in names},
                                    SecAggConfig(t, k), CTX, drops)
    expected = _expected(names, t, k, drops)
    event("aborted" if expected is None else "completed")
    if expected is None:
        assert outcome.total is None and outcome.aborted, "must abort below the threshold"
        return
    assert outcome.aborted == "" and outcome.survivors == expected
    plain = np.zeros(d + 1, spec.dtype)
    for s in expected:
        plain += encoded[s]
    assert np.array_equal(outcome.total, plain)      # masks cancel exactly in the ring
    mean, weight = spec.decode_mean(outcome.total)
    reference = sum(weights[s] * np.clip(floats[s], -2, 2) for s in expected) / weight
    assert weight == sum(weights[s] for s in expected)
    assert np.all(np.abs(mean - reference) <= spec.error_bound(len(expected), weight) + 1e-12)


def test_too_few_survivors_abort_names_the_stage(identities: dict[str, Identity]) -> None:
    names = sorted(identities)[:5]
    encoded = {s: np.arange(4, dtype=np.uint64) for s in names}
    drops = {names[0]: "input", names[1]: "input", names[2]: "consistency"}
    outcome = run_local_aggregation(encoded, {s: identities[s] for s in names},
                                    SecAggConfig(3), CTX, drops)
    assert outcome.total is None
    assert "consistency check" in outcome.aborted and "threshold is 3" in outcome.aborted


# -- refusals ----------------------------------------------------------------------------------
class _Round:
    """Three silos taken to the unmask stage by hand, so single messages can be tampered with."""

    def __init__(self, identities: dict[str, Identity], drop: str | None = None) -> None:
        self.names = sorted(identities)[:3]
        self.server = SecAggServer(CTX, SecAggConfig(2), self.names, 3, np.uint64)
        self.clients = {s: SecAggClient(s, CTX, SecAggConfig(2), identities[s].key_pem,
                                        identities[s].ca_pem) for s in self.names}
        for s, c in self.clients.items():
            self.server.add_advert(s, c.advert(), identities[s].cert_pem)
        self.server.close_stage()
        for s, c in self.clients.items():
            self.server.add_shares(s, c.share_keys(self.server.relayed_adverts()))
        self.server.close_stage()
        self.sent: dict[str, np.ndarray] = {}          # what each silo put on the wire
        for s, c in self.clients.items():
            if s != drop:
                self.sent[s] = c.mask_input(np.ones(3, np.uint64), self.server.shares_for(s))
                self.server.add_masked_input(s, self.sent[s].copy())
        self.server.close_stage()
        for s in self.server.survivors:
            self.server.add_signature(s, self.clients[s].sign_survivors(self.server.survivors))
        self.server.close_stage()


def test_silo_refuses_to_reveal_both_shares_of_one_peer(identities) -> None:
    r = _Round(identities, drop="silo-2")
    me = r.clients["silo-0"]
    honest = r.server.unmask_request("silo-0")
    assert honest.key_shares_of == ("silo-2",)
    both = replace(honest, seed_shares_of=honest.seed_shares_of + ("silo-2",))
    with pytest.raises(ProtocolError, match="both the seed share and the key share of silo-2"):
        me.reveal(both)
    key_of_survivor = replace(honest, seed_shares_of=("silo-0",),
                              key_shares_of=("silo-1", "silo-2"))
    with pytest.raises(ProtocolError, match="key share of a surviving silo"):
        me.reveal(key_of_survivor)
    claims_dropped = replace(honest, survivors=("silo-0",), seed_shares_of=("silo-0",),
                             key_shares_of=("silo-1", "silo-2"))
    with pytest.raises(ProtocolError, match="other survivors"):
        me.reveal(claims_dropped)
    unsigned = replace(honest, signatures=())
    with pytest.raises(ProtocolError, match="valid consistency signatures"):
        me.reveal(unsigned)
    forged = replace(honest, signatures=tuple(replace(s, signature=s.signature[:-2] + b"00")
                                              for s in honest.signatures))
    with pytest.raises(ProtocolError, match="valid consistency signatures"):
        me.reveal(forged)
    revealed = me.reveal(honest)                         # the honest request is answered ...
    assert {(x.owner, x.kind) for x in revealed} == {
        ("silo-0", ShareKind.MASK_SEED), ("silo-1", ShareKind.MASK_SEED),
        ("silo-2", ShareKind.MASK_KEY)}
    with pytest.raises(ProtocolError, match="stage revealed"):
        me.reveal(UnmaskRequest(honest.survivors, (), ("silo-1",), honest.signatures))


def test_dropped_silo_is_recovered_and_its_input_excluded(identities) -> None:
    r = _Round(identities, drop="silo-2")
    for s in r.server.signers:
        r.server.add_reveal(s, r.clients[s].reveal(r.server.unmask_request(s)))
    r.server.close_stage()
    assert np.array_equal(r.server.unmask(), np.full(3, 2, np.uint64))


def test_client_enforces_stage_order_and_routing(identities) -> None:
    names = sorted(identities)[:3]
    clients = {s: SecAggClient(s, CTX, SecAggConfig(2), identities[s].key_pem,
                               identities[s].ca_pem) for s in names}
    a = clients[names[0]]
    with pytest.raises(ProtocolError, match="cannot send a masked input at stage new"):
        a.mask_input(np.zeros(2, np.uint64), [])
    with pytest.raises(ProtocolError, match="cannot reveal shares"):
        a.reveal(UnmaskRequest((), (), (), ()))
    server = SecAggServer(CTX, SecAggConfig(2), names, 2, np.uint64)
    for s, c in clients.items():
        server.add_advert(s, c.advert(), identities[s].cert_pem)
    with pytest.raises(ProtocolError, match="cannot advertise keys at stage advertised"):
        a.advert()
    server.close_stage()
    bundle = server.relayed_adverts()
    swapped = [replace(bundle[0], advert=bundle[1].advert)] + bundle[1:]
    with pytest.raises(ProtocolError, match="twice"):
        a.share_keys(swapped)
    sealed = {s: c.share_keys(bundle) for s, c in clients.items()}
    b_to_a = next(x for x in sealed[names[1]] if x.receiver == names[0])
    c_to_b = next(x for x in sealed[names[2]] if x.receiver == names[1])
    with pytest.raises(ProtocolError, match="routed to this silo"):
        a.mask_input(np.zeros(2, np.uint64), [c_to_b])
    tampered = replace(b_to_a, box=b_to_a.box[:-1] + bytes([b_to_a.box[-1] ^ 1]))
    with pytest.raises(ProtocolError, match="does not authenticate"):
        a.mask_input(np.zeros(2, np.uint64), [tampered])
    forwarded = replace(c_to_b, receiver=names[0])       # re-addressed: AAD no longer matches
    with pytest.raises(ProtocolError, match="does not authenticate"):
        a.mask_input(np.zeros(2, np.uint64), [forwarded])


def test_server_checks_senders_stages_and_payloads(identities) -> None:
    names = sorted(identities)[:3]
    server = SecAggServer(CTX, SecAggConfig(2), names, 5, np.uint32)
    clients = {s: SecAggClient(s, CTX, SecAggConfig(2), identities[s].key_pem,
                               identities[s].ca_pem) for s in names}
    advert = clients[names[0]].advert()
    with pytest.raises(ProtocolError, match="naming"):
        server.add_advert(names[1], advert, identities[names[1]].cert_pem)
    server.add_advert(names[0], advert, identities[names[0]].cert_pem)
    with pytest.raises(ProtocolError, match="already answered"):
        server.add_advert(names[0], advert, identities[names[0]].cert_pem)
    with pytest.raises(ProtocolError, match="at stage advertise"):
        server.add_masked_input(names[0], np.zeros(5, np.uint32))
    with pytest.raises(ProtocolError, match="not expected"):
        server.add_advert("stranger", replace(advert, silo="stranger"), b"")
    server.drop(names[1])
    assert server.waiting_for() == {names[2]}
    server.add_advert(names[2], clients[names[2]].advert(), identities[names[2]].cert_pem)
    assert server.stage_complete()
    server.close_stage()
    sealed = clients[names[0]].share_keys(server.relayed_adverts())
    with pytest.raises(ProtocolError, match="exactly one share"):
        server.add_shares(names[0], sealed[:0])
    with pytest.raises(ProtocolError, match="another silo's name"):
        server.add_shares(names[2], sealed)
    server.add_shares(names[0], sealed)
    server.add_shares(names[2], clients[names[2]].share_keys(server.relayed_adverts()))
    server.close_stage()
    with pytest.raises(ProtocolError, match="uint32 of shape"):
        server.add_masked_input(names[0], np.zeros(5, np.uint64))
    with pytest.raises(ProtocolError, match="not expected"):
        server.add_masked_input(names[1], np.zeros(5, np.uint32))


def test_threshold_is_checked_by_the_client_too(identities) -> None:
    names = sorted(identities)[:3]
    clients = {s: SecAggClient(s, CTX, SecAggConfig(3), identities[s].key_pem,
                               identities[s].ca_pem) for s in names}
    server = SecAggServer(CTX, SecAggConfig(1), names, 2, np.uint64)   # a lax coordinator
    for s in names[:2]:
        server.add_advert(s, clients[s].advert(), identities[s].cert_pem)
    server.drop(names[2])
    server.close_stage()
    with pytest.raises(TooFewSurvivors, match="threshold is 3"):
        clients[names[0]].share_keys(server.relayed_adverts())


def test_masked_input_hides_the_vector_and_secrets_stay_out_of_repr(identities) -> None:
    r = _Round(identities)
    assert "secret" in repr(r.clients["silo-0"]) and "share" not in repr(r.clients["silo-0"])
    for s in r.names:
        masked = r.sent[s]
        assert np.count_nonzero(masked == 1) == 0    # 64-bit masks: a collision is ~2^-62


@pytest.mark.parametrize("drop", [None, "silo-1"])
def test_the_server_keeps_one_running_sum_equal_bit_for_bit_to_the_stored_vectors(
        identities, drop: str | None) -> None:
    """Masked inputs are summed as they arrive (one vector per attempt, not one per silo): the
    running sum is the ring sum of every vector sent, and unmasking it gives the plain sum."""
    r = _Round(identities, drop=drop)
    stored = np.zeros(3, np.uint64)
    for vector in r.sent.values():
        stored += vector                                 # wraps modulo 2^64, as the ring does
    assert r.server.input_sum is not None
    assert r.server.input_sum.dtype == np.uint64 and np.array_equal(r.server.input_sum, stored)
    assert r.server.inputs == set(r.sent) == set(r.server.survivors)
    with pytest.raises(ValueError, match="read-only"):
        r.server.input_sum[0] = 1                        # a view: the sum cannot be touched
    for s in r.server.signers:
        r.server.add_reveal(s, r.clients[s].reveal(r.server.unmask_request(s)))
    r.server.close_stage()
    assert np.array_equal(r.server.unmask(), np.full(3, len(r.sent), np.uint64))
    assert r.server.input_sum is None                    # nothing kept after unmasking
    with pytest.raises(ProtocolError, match="unmasked already"):
        r.server.unmask()


def test_server_refuses_adverts_not_signed_by_the_senders_certificate(identities) -> None:
    """Found by tests/e2e/test_fuzz.py: a garbage signature was relayed, and every honest peer
    then stopped at key sharing; now only the sender is refused."""
    names = sorted(identities)[:3]
    server = SecAggServer(CTX, SecAggConfig(2), names, 5, np.uint64)
    a, b = (SecAggClient(s, CTX, SecAggConfig(2), identities[s].key_pem, identities[s].ca_pem)
            for s in names[:2])
    good = a.advert()
    forged = [
        replace(good, signature=b"\x00" * 70),                            # garbage bytes
        replace(good, cipher_key=bytes(reversed(good.cipher_key))),       # keys swapped in
        replace(good, mask_key=good.cipher_key),                          # one key twice
        replace(good, silo=names[1], signature=b.advert().signature),    # a peer's signature
    ]
    other_round = SecAggClient(names[0], replace(CTX, round=CTX.round + 1), SecAggConfig(2),
                               identities[names[0]].key_pem, identities[names[0]].ca_pem)
    forged.append(other_round.advert())                                   # replayed elsewhere
    for advert in forged:
        sender = advert.silo
        with pytest.raises(ProtocolError, match="not signed by its certificate|reuses one key"):
            server.add_advert(sender, advert, identities[names[0]].cert_pem)
    assert server.adverts == {}
    server.add_advert(names[0], good, identities[names[0]].cert_pem)
    assert set(server.adverts) == {names[0]}
