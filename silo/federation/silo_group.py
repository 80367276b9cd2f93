"""This silo's part of the silo group key, and what the group secrets protect: FedHGN's sealed
coefficient envelopes and GCFL's encrypted similarity (crypto/groupkey.py sets the key up).

The session (silo/federation/session.py) holds one and decides when each step is due; this
holds the setup in progress and the secrets it ends with, which never leave the silo (a
restarted silo reads them back from its own disk).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trellis.crypto import ckks
from trellis.crypto.envelopes import envelope_aad, open_records, seal_records
from trellis.crypto.errors import CryptoError, ProtocolError
from trellis.crypto.groupkey import (
    GroupKeyLeader,
    GroupKeyMember,
    GroupSecrets,
    SetupAdvert,
    leader_of,
    setup_context,
)
from trellis.crypto.pki import Identity
from trellis.protos.messages import Instruction
from trellis.protos.plan import PublicPlan
from trellis.silo.federation.coefficients import record_bytes, records_to_rows, rows_to_records

_COEFFICIENTS = "coefficients"


class SiloGroup:
    """One silo's group-key setup and the group secrets it ends with (None until then)."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        self.secrets: GroupSecrets | None = None
        self._party: GroupKeyLeader | GroupKeyMember | None = None
        self._ckks_public = b""

    # -- the setup ------------------------------------------------------------------------------
    def setup_advert(self, federation: str, run: str, instruction: Instruction,
                     with_ckks: bool) -> bytes:
        """A signed setup key for the silo group key in this run of the federation (the leader
        also draws the secrets, with a CKKS context when with_ckks)."""
        name = self.identity.name
        silos = instruction.participants
        if name not in silos:
            raise ProtocolError("this silo is not part of the group-key setup")
        # The setup run number (the attempt) tells a setup repeated after a coordinator restart
        # from the first; the coordinator's run id tells this run of the federation from others.
        context = setup_context(federation, instruction.envelope.attempt, run=run)
        if leader_of(silos) == name:
            secret, public = ckks.make_ckks_contexts() if with_ckks else (b"", b"")
            leader = GroupKeyLeader(self.identity, context, silos, ckks_secret=secret)
            self._party, self._ckks_public = leader, public
            self.secrets = leader.secrets
        else:
            self._party = GroupKeyMember(self.identity, context, silos)
        return self._party.advert.to_bytes()

    def seal(self, bundle: dict[str, tuple[bytes, bytes]]) -> tuple[dict[str, bytes], bytes]:
        """Leader: verify each peer's advert and seal the group secrets for it."""
        party = self._party
        if not isinstance(party, GroupKeyLeader):
            raise ProtocolError("only the group-key leader seals group secrets")
        name = self.identity.name
        adverts = {s: SetupAdvert.from_bytes(a) for s, (a, _) in bundle.items() if s != name}
        certificates = {s: c for s, (_, c) in bundle.items() if s != name}
        return party.seal_all(adverts, certificates), self._ckks_public

    def open(self, box: bytes, leader_advert: bytes, leader_certificate: bytes) -> None:
        """Member: verify the leader's advert against its certificate and open the box."""
        party = self._party
        if not isinstance(party, GroupKeyMember):
            raise ProtocolError("no group-key setup in progress for this silo")
        self.secrets = party.open(box, SetupAdvert.from_bytes(leader_advert), leader_certificate)

    @property
    def group_key(self) -> bytes:
        """The silo group key; ProtocolError until the setup has completed."""
        if self.secrets is None:
            raise ProtocolError("no silo group key: the group-key setup has not completed")
        return self.secrets.group_key

    # -- FedHGN's coefficient envelopes ---------------------------------------------------------
    def seal_coefficients(self, plan: PublicPlan, run: str, rows: np.ndarray) -> bytes:
        """This silo's coefficient rows as one envelope of the plan's size, under the group key,
        bound to this run of the federation."""
        hetero = plan.hetero
        records = rows_to_records(rows)
        return seal_records(self.group_key, records, slots=hetero.coefficient_slots,
                            record_bytes=record_bytes(hetero.bases), aad=_envelope_aad(plan, run))

    def open_coefficients(self, plan: PublicPlan, run: str,
                          envelopes: Sequence[bytes]) -> np.ndarray:
        """The real records of other silos' envelopes as rows; ProtocolError if one is refused."""
        hetero = plan.hetero
        key = self.group_key
        records: list[bytes] = []
        try:
            for envelope in envelopes:
                records += open_records(key, envelope, slots=hetero.coefficient_slots,
                                        record_bytes=record_bytes(hetero.bases),
                                        aad=_envelope_aad(plan, run))
            return records_to_rows(records, hetero.bases)
        except (CryptoError, ValueError) as exc:
            raise ProtocolError(f"a coefficient envelope was refused: {exc}") from None

    # -- GCFL's similarity ----------------------------------------------------------------------
    def encrypt_update(self, update: np.ndarray) -> list[bytes]:
        """An update, normalised and encrypted under the group's CKKS key."""
        return ckks.encrypt_unit_vector(self._ckks_secret(), update)

    def decrypt_similarities(self, blinded: dict[tuple[str, str], bytes]
                             ) -> dict[tuple[str, str], float]:
        """Decrypt blinded inner products (single values only; never a whole vector)."""
        return ckks.decrypt_blinded(self._ckks_secret(), blinded)

    def _ckks_secret(self) -> bytes:
        if self.secrets is None or not self.secrets.ckks_secret:
            raise ProtocolError("no CKKS secret context: the group key was not established")
        return self.secrets.ckks_secret


def _envelope_aad(plan: PublicPlan, run: str) -> bytes:
    return envelope_aad(plan.federation, _COEFFICIENTS, run=run)
