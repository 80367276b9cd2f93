"""Group-key setup (crypto/groupkey.py): leader election, signed setup adverts, sealed secrets.

The coordinator is simulated as a relay of opaque bytes that may also try to substitute keys,
misroute boxes or replay them into another setup attempt; every such attempt must be refused.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from trellis.crypto.errors import ProtocolError
from trellis.crypto.groupkey import (
    GroupKeyLeader,
    GroupKeyMember,
    GroupSecrets,
    SetupAdvert,
    leader_of,
    make_setup_advert,
    open_group_secrets,
    seal_group_secrets,
    setup_context,
    verify_setup_advert,
)
from trellis.crypto.keyagreement import EphemeralKeyPair, RoundContext
from trellis.crypto.pki import Identity, throwaway_identities

SILOS = ["delta", "bravo", "alpha", "charlie"]
CTX = setup_context("fed", 1, run="run-1")


@pytest.fixture(scope="module")
def identities(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Identity]:
    return throwaway_identities(SILOS, tmp_path_factory.mktemp("groupkey-pki"))


@pytest.fixture(scope="module")
def outsider(tmp_path_factory: pytest.TempPathFactory) -> Identity:
    """An identity called "alpha" issued by a CA that is not the federation's."""
    return throwaway_identities(["alpha"], tmp_path_factory.mktemp("outsider-pki"))["alpha"]


def _relay(advert: SetupAdvert) -> SetupAdvert:
    """What the coordinator does with an advert: pass opaque bytes on."""
    return SetupAdvert.from_bytes(advert.to_bytes())


def _setup(identities: dict[str, Identity], context: RoundContext = CTX,
           ckks_secret: bytes = b"") -> tuple[GroupKeyLeader, dict[str, GroupKeyMember],
                                              dict[str, bytes]]:
    leader = GroupKeyLeader(identities["alpha"], context, SILOS, ckks_secret=ckks_secret)
    members = {name: GroupKeyMember(identities[name], context, SILOS)
               for name in SILOS if name != "alpha"}
    adverts = {name: _relay(member.advert) for name, member in members.items()}
    certificates = {name: identities[name].cert_pem for name in members}
    return leader, members, leader.seal_all(adverts, certificates)


def test_leader_is_the_first_live_silo_by_name() -> None:
    assert leader_of(SILOS) == "alpha"
    assert leader_of(["zulu", "mike"]) == "mike"
    assert leader_of(iter(["solo"])) == "solo"
    with pytest.raises(ProtocolError, match="no live silo"):
        leader_of([])


def test_every_member_ends_up_with_the_leaders_secrets(identities: dict[str, Identity]) -> None:
    leader, members, boxes = _setup(identities, ckks_secret=b"ckks-context-bytes")
    assert set(boxes) == {"bravo", "charlie", "delta"}
    leader_advert = _relay(leader.advert)
    got = {name: member.open(boxes[name], leader_advert, identities["alpha"].cert_pem)
           for name, member in members.items()}
    assert all(secrets == leader.secrets for secrets in got.values())
    assert len(leader.secrets.group_key) == 32
    assert leader.secrets.ckks_secret == b"ckks-context-bytes"
    # A second setup draws a different key.
    again, _, _ = _setup(identities)
    assert again.secrets.group_key != leader.secrets.group_key


def test_secrets_appear_in_no_relayed_bytes(identities: dict[str, Identity]) -> None:
    ckks = bytes(range(256)) * 8
    leader, members, boxes = _setup(identities, ckks_secret=ckks)
    relayed = [leader.advert.to_bytes(), *boxes.values(),
               *(member.advert.to_bytes() for member in members.values())]
    for data in relayed:
        assert leader.secrets.group_key not in data
        assert leader.secrets.group_key[:8] not in data
        assert ckks[:32] not in data and ckks[1000:1032] not in data
        assert leader.secrets.to_bytes()[:64] not in data
    assert leader.secrets.group_key.hex() not in repr(leader.secrets)
    assert repr(leader.secrets) == "GroupSecrets(group_key=<32 bytes>, ckks_secret=<2048 bytes>)"


def test_group_secrets_round_trip_a_real_ckks_secret_context(
        identities: dict[str, Identity]) -> None:
    from trellis.crypto import ckks  # tenseal is only needed here

    secret, public = ckks.make_ckks_contexts()
    encoded = GroupSecrets.generate(secret).to_bytes()
    decoded = GroupSecrets.from_bytes(encoded)
    assert decoded.ckks_secret == secret and GroupSecrets.from_bytes(decoded.to_bytes()) == decoded
    leader, members, boxes = _setup(identities, ckks_secret=secret)
    bravo = members["bravo"].open(boxes["bravo"], leader.advert, identities["alpha"].cert_pem)
    charlie = members["charlie"].open(boxes["charlie"], leader.advert,
                                      identities["alpha"].cert_pem)
    # What bravo encrypts with the secret it received, charlie can decrypt with its own copy.
    vector = np.arange(1.0, 9.0)
    chunks = ckks.encrypt_unit_vector(bravo.ckks_secret, vector)
    blinded, offsets = ckks.blinded_inner_products(public, {"bravo": chunks, "charlie": chunks})
    opened = ckks.decrypt_blinded(charlie.ckks_secret, blinded, ["bravo", "charlie"])
    matrix = ckks.similarity_matrix(["bravo", "charlie"], opened, offsets)
    assert matrix[0, 1] == pytest.approx(1.0, abs=1e-3)


def test_malformed_group_secrets_are_refused() -> None:
    good = GroupSecrets.generate(b"ckks").to_bytes()
    cases = {
        "not encoded group secrets": b"XYZ" + good[3:],
        "unsupported version 2": good[:3] + b"\x02" + good[4:],
        "truncated": good[:-1],
        "trailing bytes": good + b"\x00",
    }
    for message, data in cases.items():
        with pytest.raises(ProtocolError, match=message):
            GroupSecrets.from_bytes(data)
    for short in (b"", good[:2], good[:6]):
        with pytest.raises(ProtocolError, match="truncated"):
            GroupSecrets.from_bytes(short)
    with pytest.raises(ProtocolError, match="32 bytes"):
        GroupSecrets(b"short")
    with pytest.raises(ProtocolError, match="32 bytes"):
        GroupSecrets.from_bytes(good[:4] + b"\x00\x00\x00\x01k" + good[4 + 4 + 32:])
    with pytest.raises(ProtocolError, match="trailing"):
        SetupAdvert.from_bytes(SetupAdvert("a", b"k" * 32, b"s").to_bytes() + b"!")
    with pytest.raises(ProtocolError, match="not a setup advert"):
        SetupAdvert.from_bytes(good)


def test_members_refuse_a_substituted_leader_key(identities: dict[str, Identity],
                                                 outsider: Identity) -> None:
    leader, members, boxes = _setup(identities)
    bravo = members["bravo"]
    genuine_cert = identities["alpha"].cert_pem
    evil = EphemeralKeyPair()
    # Re-signed by a key the federation CA never certified.
    forged = make_setup_advert("alpha", evil, CTX, outsider.key_pem)
    with pytest.raises(ProtocolError, match="not valid"):
        bravo.open(boxes["bravo"], forged, outsider.cert_pem)
    with pytest.raises(ProtocolError, match="invalid signature"):
        bravo.open(boxes["bravo"], forged, genuine_cert)
    # The key swapped without re-signing.
    swapped = replace(leader.advert, public_key=evil.public_bytes)
    with pytest.raises(ProtocolError, match="invalid signature"):
        bravo.open(boxes["bravo"], swapped, genuine_cert)
    # Another silo's genuine advert presented as the leader's.
    with pytest.raises(ProtocolError, match="not the advert of the leader"):
        bravo.open(boxes["bravo"], members["charlie"].advert, identities["charlie"].cert_pem)
    # The leader's genuine advert with another silo's certificate.
    with pytest.raises(ProtocolError, match="certificate is 'charlie'"):
        bravo.open(boxes["bravo"], leader.advert, identities["charlie"].cert_pem)
    assert bravo.open(boxes["bravo"], leader.advert, genuine_cert) == leader.secrets


def test_leader_refuses_a_substituted_peer_key(identities: dict[str, Identity],
                                               outsider: Identity) -> None:
    leader, members, _ = _setup(identities)
    evil = EphemeralKeyPair()
    swapped = replace(members["bravo"].advert, public_key=evil.public_bytes)
    with pytest.raises(ProtocolError, match="invalid signature"):
        leader.seal_for(swapped, identities["bravo"].cert_pem)
    resigned = make_setup_advert("bravo", evil, CTX, outsider.key_pem)
    with pytest.raises(ProtocolError, match="invalid signature"):
        leader.seal_for(resigned, identities["bravo"].cert_pem)
    stranger = make_setup_advert("alpha", evil, CTX, outsider.key_pem)
    with pytest.raises(ProtocolError, match="not valid"):
        verify_setup_advert(stranger, outsider.cert_pem, identities["alpha"].ca_pem, CTX)
    adverts = {name: member.advert for name, member in members.items()}
    certificates = {name: identities[name].cert_pem for name in members}
    with pytest.raises(ProtocolError, match="invalid signature"):
        leader.seal_all({**adverts, "bravo": swapped}, certificates)
    with pytest.raises(ProtocolError, match="filed under 'bravo' names 'charlie'"):
        leader.seal_all({**adverts, "bravo": adverts["charlie"]}, certificates)
    del adverts["delta"]
    with pytest.raises(ProtocolError, match="no advert or certificate from delta"):
        leader.seal_all(adverts, certificates)


def test_a_box_opens_only_for_its_receiver(identities: dict[str, Identity]) -> None:
    leader, members, boxes = _setup(identities)
    cert = identities["alpha"].cert_pem
    with pytest.raises(ProtocolError, match="for 'charlie' do not authenticate"):
        members["charlie"].open(boxes["bravo"], leader.advert, cert)
    tampered = bytearray(boxes["bravo"])
    tampered[20] ^= 1
    with pytest.raises(ProtocolError, match="do not authenticate"):
        members["bravo"].open(bytes(tampered), leader.advert, cert)
    with pytest.raises(ProtocolError, match="truncated"):
        members["bravo"].open(boxes["bravo"][:27], leader.advert, cert)


def test_boxes_and_adverts_do_not_carry_over_to_another_context(
        identities: dict[str, Identity]) -> None:
    alpha, bravo = identities["alpha"], identities["bravo"]
    leader_keys, bravo_keys = EphemeralKeyPair(), EphemeralKeyPair()
    first, second = setup_context("fed", 1, run="run-1"), setup_context("fed", 2, run="run-1")
    other_federation = setup_context("other", 1, run="run-1")
    other_run = setup_context("fed", 1, run="run-2")       # the same federation started afresh
    secrets = GroupSecrets.generate()
    bravo_advert = make_setup_advert("bravo", bravo_keys, first, bravo.key_pem)
    leader_advert = make_setup_advert("alpha", leader_keys, first, alpha.key_pem)
    box = seal_group_secrets(secrets, leader_keys, bravo_advert, first, "alpha", "bravo")
    assert open_group_secrets(box, bravo_keys, leader_advert, first, "alpha", "bravo") == secrets
    for replayed in (second, other_federation, other_run):
        with pytest.raises(ProtocolError, match="do not authenticate"):
            open_group_secrets(box, bravo_keys, leader_advert, replayed, "alpha", "bravo")
        with pytest.raises(ProtocolError, match="invalid signature"):
            verify_setup_advert(leader_advert, alpha.cert_pem, alpha.ca_pem, replayed)
    # Same keys, but the box claims another leader/receiver route.
    with pytest.raises(ProtocolError, match="not the advert of the leader"):
        open_group_secrets(box, bravo_keys, leader_advert, first, "bravo", "alpha")
    with pytest.raises(ProtocolError, match="round 0, not round 3"):
        verify_setup_advert(leader_advert, alpha.cert_pem, alpha.ca_pem,
                            RoundContext("fed", 3, 1, run="run-1"))
    with pytest.raises(ProtocolError, match="round 0"):
        GroupKeyLeader(alpha, RoundContext("fed", 1, 1, run="run-1"), SILOS)


def test_roles_are_checked(identities: dict[str, Identity]) -> None:
    with pytest.raises(ProtocolError, match="'bravo' is not the leader; 'alpha' is"):
        GroupKeyLeader(identities["bravo"], CTX, SILOS)
    with pytest.raises(ProtocolError, match="is the leader"):
        GroupKeyMember(identities["alpha"], CTX, SILOS)
    with pytest.raises(ProtocolError, match="not among the live silos"):
        GroupKeyMember(identities["delta"], CTX, ["alpha", "bravo"])
    # With alpha gone, bravo leads and charlie accepts only bravo's box.
    live = ["bravo", "charlie"]
    leader = GroupKeyLeader(identities["bravo"], CTX, live)
    charlie = GroupKeyMember(identities["charlie"], CTX, live)
    with pytest.raises(ProtocolError, match="not among the live silos"):
        leader.seal_for(GroupKeyMember(identities["delta"], CTX, SILOS).advert,
                        identities["delta"].cert_pem)
    box = leader.seal_for(charlie.advert, identities["charlie"].cert_pem)
    assert charlie.open(box, leader.advert, identities["bravo"].cert_pem) == leader.secrets


def test_setup_advert_bytes_round_trip(identities: dict[str, Identity]) -> None:
    advert = make_setup_advert("bravo", EphemeralKeyPair(), CTX, identities["bravo"].key_pem)
    assert SetupAdvert.from_bytes(advert.to_bytes()) == advert
    verify_setup_advert(_relay(advert), identities["bravo"].cert_pem,
                        identities["bravo"].ca_pem, CTX)
    with pytest.raises(ProtocolError, match="malformed public key"):
        verify_setup_advert(replace(advert, public_key=b"x"), identities["bravo"].cert_pem,
                            identities["bravo"].ca_pem, CTX)
