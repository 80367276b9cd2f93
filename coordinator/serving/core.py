"""Thread-safe home of the round machine inside the server: audit trail, checkpoints, waiting.

gRPC handlers call these methods; each applies one input to the machine under a lock, appends
the resulting events to the audit log, prints progress, checkpoints completed rounds and wakes
the control streams waiting for a new instruction: threads waiting on its condition, and the
asyncio server's streams through `on_change` (a callback that must not block).

Over 400 lines because it is the one door to the round machine: a short method for each of the
machine's protocol inputs, all under the same lock and the same audit, checkpoint and wake-up
path; split by input, that path would be repeated or spread over modules.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from trellis.coordinator.operations.progress import Progress
from trellis.coordinator.operations.status import snapshot
from trellis.coordinator.rounds.errors import InvalidPayload
from trellis.coordinator.rounds.machine import Event, RoundMachine, Stage
from trellis.coordinator.serving.holders import NAME_IN_USE, Holders, NameInUse
from trellis.coordinator.state.checkpoint import save_checkpoint
from trellis.crypto.audit import AuditLog
from trellis.crypto.certificates import certificate_fingerprint
from trellis.crypto.secagg import RevealedShare
from trellis.protos.codec import blobs_digest, numbered_values
from trellis.protos.messages import (
    Envelope,
    Instruction,
    KeyAdvertisement,
    KeyBundle,
    MetricsReport,
    Phase,
    SealedShares,
    SignedSurvivors,
    UnmaskInstruction,
)
from trellis.protos.plan import Plan
from trellis.protos.status import FederationStatus

_ENDINGS = (Phase.FINISHED, Phase.ROUND_ABORTED)     # instructions that end a silo's part


class CoordinatorCore:
    """The machine plus everything around it that is not transport."""

    def __init__(self, plan: Plan, machine: RoundMachine, audit: AuditLog,
                 clock: Callable[[], float], progress: Progress | None = None) -> None:
        self.plan = plan
        self.machine = machine
        self.audit = audit
        self.clock = clock
        self.progress = progress
        self._cond = threading.Condition()
        self._connections: dict[str, int] = {}
        self._holders = Holders()            # the certificate each open stream holds
        self._told: dict[str, Phase] = {}    # the phase each open stream last handed over
        self._next_token = 0
        self._refused: dict[str, str] = {}   # certificate subject -> why it was refused
        self.started = clock()
        self.started_at = time.time()         # wall clock, for the operator
        self.stopping = False
        self._listeners: list[Callable[[], None]] = []

    # -- watching (coordinator status) --------------------------------------------------------
    def locked(self) -> AbstractContextManager[Any]:
        """Hold the core's lock (re-entrant) while reading several things consistently."""
        return self._cond

    def status(self) -> FederationStatus:
        """The federation's status now (coordinator status, the Admin service)."""
        with self._cond:
            return snapshot(self.machine, connected=self._connections, refused=self._refused,
                            started_at=self.started_at, elapsed_s=self.clock() - self.started,
                            pid=os.getpid())

    def refused(self, subject: str, reason: str, **fields: Any) -> None:
        """A certificate was refused: audit it and show it in the status."""
        self.audit.append("refused", subject=subject, reason=reason, **fields)
        if self.progress is not None:
            serial = f" (serial {fields['serial']})" if "serial" in fields else ""
            self.progress.refused(subject, f"{reason}{serial}")
        with self._cond:
            self._refused[subject] = reason
            self._notify()

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call listener (under the core's lock; it must not block) whenever waiters are woken:
        an instruction, a delivery, a refusal or the stop may have changed."""
        with self._cond:
            self._listeners.append(listener)

    def _notify(self) -> None:
        self._cond.notify_all()
        for listener in self._listeners:
            listener()

    # -- presence -----------------------------------------------------------------------------
    def connect(self, silo: str, certificate_pem: bytes) -> int:
        """A silo's control stream opened; returns a token for `disconnect` (or NameInUse)."""
        fingerprint = certificate_fingerprint(certificate_pem)
        with self._cond:
            self.check_holder(silo, fingerprint)
            if silo in self._connections:
                # A new stream with the same certificate while the old one still looks open: a
                # restarted silo process (its keys are gone) or a reconnect. The old one is over.
                self._end_stream(silo, replaced=True)
            self._next_token += 1
            self._connections[silo] = self._next_token
            self._holders.hold(silo, fingerprint)
            self._refused.pop(silo, None)     # admitted now (e.g. renewed after a revocation)
            self.audit.append("connected", silo=silo, certificate=fingerprint)
            self._apply(self.machine.join(silo, certificate_pem, self.clock()))
            return self._next_token

    def holds_other(self, silo: str, fingerprint: str) -> bool:
        """Whether another certificate's stream holds silo's name now (a read, without the lock:
        `check_holder` decides under it)."""
        return self._holders.other_than(silo, fingerprint) is not None

    def check_holder(self, silo: str, fingerprint: str) -> None:
        """Refuse (NameInUse, audited) a certificate other than the one connected as silo."""
        with self._cond:
            holder = self._holders.other_than(silo, fingerprint)
            if holder is None:
                return
            self.refused(silo, NAME_IN_USE, certificate=fingerprint, connected=holder)
        raise NameInUse(silo, holder)

    def disconnect(self, silo: str, token: int) -> None:
        """A control stream ended; the silo leaves unless a newer stream replaced it."""
        with self._cond:
            if self._connections.get(silo) == token:
                self._end_stream(silo)

    def _end_stream(self, silo: str, **fields: Any) -> None:
        """Forget the silo's stream; it leaves the federation until it attends again."""
        del self._connections[silo]
        self._holders.release(silo)
        self._told.pop(silo, None)
        if self.stopping:
            return          # streams torn down by shutdown; the audit log is closed
        self.audit.append("disconnected", silo=silo, **fields)
        self._apply(self.machine.leave(silo, self.clock()))

    def instruction(self, silo: str) -> Instruction:
        """The silo's current instruction, without waiting."""
        with self._cond:
            return self.machine.instruction(silo)

    def instruction_if_free(self, silo: str) -> Instruction | None:
        """The silo's current instruction if the lock is free now; None, without waiting, if
        another thread holds it (an event loop asks here before handing the read to a thread)."""
        if not self._cond.acquire(blocking=False):
            return None
        try:
            return self.machine.instruction(silo)
        finally:
            self._cond.release()

    def wait_instruction(self, silo: str, last: Instruction | None,
                         timeout: float) -> Instruction:
        """The silo's current instruction, waiting up to timeout for it to differ from last."""
        with self._cond:
            current = self.machine.instruction(silo)
            if current == last and not self.stopping:
                self._cond.wait(timeout)
                current = self.machine.instruction(silo)
            return current

    def delivered(self, silo: str, token: int, instruction: Instruction) -> None:
        """A silo's stream handed an instruction to the transport."""
        with self._cond:
            if self._connections.get(silo) == token:
                self._told[silo] = instruction.envelope.phase
                # Only wait_ending_delivered waits for this: the instruction streams need not
                # wake for it.
                self._cond.notify_all()

    def wait_ending_delivered(self, timeout: float) -> bool:
        """Wait until every open stream has handed over the federation's end (FINISHED or
        ROUND_ABORTED), or has closed; False if some had not within timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while any(self._told.get(s) not in _ENDINGS for s in self._connections):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    # -- protocol inputs ----------------------------------------------------------------------
    def advertise(self, silo: str, advert: KeyAdvertisement) -> None:
        """Apply a key advert."""
        with self._cond:
            self._apply(self.machine.advertise(silo, advert, self.clock()))

    def key_bundle(self, silo: str, env: Envelope) -> KeyBundle:
        """Relay the adverts of this attempt."""
        with self._cond:
            return self.machine.key_bundle(silo, env)

    def upload_shares(self, silo: str, sealed: SealedShares) -> None:
        """Apply a silo's sealed shares."""
        with self._cond:
            self._apply(self.machine.upload_shares(silo, sealed, self.clock()))

    def shares_for(self, silo: str, env: Envelope) -> SealedShares:
        """Relay the sealed shares addressed to this silo."""
        with self._cond:
            return self.machine.shares_for(silo, env)

    def sign_survivors(self, silo: str, signed: SignedSurvivors) -> None:
        """Apply a consistency signature."""
        with self._cond:
            self._apply(self.machine.sign_survivors(silo, signed, self.clock()))

    def unmask_request(self, silo: str, env: Envelope) -> UnmaskInstruction:
        """What this silo must reveal."""
        with self._cond:
            return self.machine.unmask_request(silo, env)

    def reveal_shares(self, silo: str, env: Envelope, shares: tuple[RevealedShare, ...]) -> None:
        """Apply revealed shares (the last needed ones unmask and aggregate the round)."""
        with self._cond:
            self._apply(self.machine.reveal_shares(silo, env, shares, self.clock()))

    def masked_input(self, silo: str, env: Envelope, name: str, vector: np.ndarray,
                     statistics: Mapping[str, float] | None = None) -> None:
        """Apply a masked vector; its size and digest go to the audit trail, never its values."""
        with self._cond:
            events = self.machine.masked_input(silo, env, vector, self.clock(), statistics)
            self.audit.append("received_tensor", silo=silo, round=env.round,
                              attempt=env.attempt, phase=env.phase.name, tensor=name,
                              dtype=vector.dtype.name, shape=list(vector.shape),
                              bytes=int(vector.nbytes),
                              sha256=hashlib.sha256(vector.tobytes()).hexdigest(),
                              # GCFL's update norms come in plain (DESIGN.md): what the
                              # coordinator saw belongs in its record.
                              **({"statistics": dict(statistics)} if statistics else {}))
            self._apply(events)

    # -- silo group key and GCFL similarity (opaque byte strings, relayed) ---------------------
    def setup_advert(self, silo: str, env: Envelope, advert: bytes) -> None:
        """Apply a silo's signed setup key."""
        with self._cond:
            self._apply(self.machine.setup_advert(silo, env, advert, self.clock()))

    def setup_bundle(self, silo: str, env: Envelope) -> dict[str, tuple[bytes, bytes]]:
        """Relay the setup adverts to the leader."""
        with self._cond:
            return self.machine.setup_bundle(silo, env)

    def setup_seal(self, silo: str, env: Envelope, blobs: Mapping[str, bytes]) -> None:
        """Apply the leader's sealed boxes ("box/<peer>") and CKKS public context."""
        boxes = {k.removeprefix("box/"): v for k, v in blobs.items() if k.startswith("box/")}
        unknown = sorted(set(blobs) - {f"box/{k}" for k in boxes} - {"ckks_public"})
        if unknown or "ckks_public" not in blobs:
            raise InvalidPayload("a group seal carries 'box/<peer>' entries and "
                                 f"'ckks_public'; got unexpected {unknown or 'no ckks_public'}")
        with self._cond:
            events = self.machine.setup_seal(silo, env, boxes, blobs["ckks_public"],
                                             self.clock())
            self._received_blobs(silo, env, blobs)
            self._apply(events)

    def setup_box(self, silo: str, env: Envelope) -> tuple[bytes, bytes, bytes]:
        """Relay a peer's sealed box with the leader's advert and certificate."""
        with self._cond:
            return self.machine.setup_box(silo, env)

    def setup_opened(self, silo: str, env: Envelope) -> None:
        """A peer opened its box."""
        with self._cond:
            self._apply(self.machine.setup_opened(silo, env, self.clock()))

    def encrypted_update(self, silo: str, env: Envelope, blobs: Mapping[str, bytes]) -> None:
        """Apply a member's CKKS ciphertexts ("ciphertext/<i>", in order)."""
        ciphertexts = numbered_values("ciphertext", blobs)
        if ciphertexts is None:
            raise InvalidPayload("encrypted update entries must be ['ciphertext/0', "
                                 f"'ciphertext/1']... in order; got {list(blobs)[:3]}")
        with self._cond:
            events = self.machine.encrypted_update(silo, env, ciphertexts, self.clock())
            self._received_blobs(silo, env, blobs)
            self._apply(events)

    def sealed_envelope(self, silo: str, env: Envelope, blobs: Mapping[str, bytes]) -> None:
        """Apply a FedHGN silo's sealed coefficient envelope (one entry named "envelope")."""
        if list(blobs) != ["envelope"]:
            raise InvalidPayload(f"a sealed envelope upload carries one entry 'envelope'; got "
                                 f"{list(blobs)[:3]}")
        with self._cond:
            events = self.machine.sealed_envelope(silo, env, blobs["envelope"], self.clock())
            self._received_blobs(silo, env, blobs)
            self._apply(events)

    def pool_for(self, silo: str, env: Envelope) -> list[bytes]:
        """The other silos' sealed envelopes, shuffled ("envelope/<i>" on the wire)."""
        with self._cond:
            return self.machine.pool_for(silo, env)

    def decrypt_request(self, silo: str, env: Envelope) -> dict[tuple[str, str], bytes]:
        """The blinded inner products, for the decrypting silo."""
        with self._cond:
            return self.machine.decrypt_request(silo, env)

    def decrypted(self, silo: str, env: Envelope, values: Mapping[tuple[str, str], float]
                  ) -> None:
        """Apply the decrypted blinded values."""
        with self._cond:
            self._apply(self.machine.decrypted(silo, env, values, self.clock()))

    def _received_blobs(self, silo: str, env: Envelope, blobs: Mapping[str, bytes]) -> None:
        self.audit.append("received_blobs", silo=silo, round=env.round, attempt=env.attempt,
                          phase=env.phase.name, count=len(blobs),
                          bytes=sum(len(b) for b in blobs.values()),
                          sha256=blobs_digest(blobs))

    def report(self, silo: str, report: MetricsReport) -> None:
        """Apply a metrics report."""
        with self._cond:
            self._apply(self.machine.report(silo, report, self.clock()))

    def state_for(self, silo: str, env: Envelope) -> np.ndarray | None:
        """The global state to send to this silo."""
        with self._cond:
            return self.machine.state_for(silo, env)

    def tick(self) -> None:
        """Deadlines: called periodically by the server."""
        with self._cond:
            self._apply(self.machine.tick(self.clock()))

    def end(self, reason: str) -> None:
        """End the federation now, unfinished: its silos are told it was aborted, for reason."""
        with self._cond:
            self._apply(self.machine.stop(reason))

    def wait_finished(self, timeout: float) -> bool:
        """Block until the federation ended or timeout; returns whether it ended."""
        with self._cond:
            if not self.machine.finished:
                self._cond.wait(timeout)
            return self.machine.finished

    def stop(self) -> None:
        """Wake every waiting stream so the server can shut down."""
        with self._cond:
            self.stopping = True
            self._notify()

    # -- internals ----------------------------------------------------------------------------
    def _apply(self, events: list[Event]) -> None:
        for event in events:
            self.audit.append(event.kind, **event.fields)
        full = any(e.kind in ("round_completed", "round_opened") for e in events)
        if full or any(_marks_progress(e, self.machine) for e in events):
            try:
                save_checkpoint(self.plan.server.state_dir, self.machine, with_state=full)
            except OSError as exc:
                # The federation goes on; only a restart from here would lose ground.
                self.audit.append("checkpoint_failed", reason=f"{type(exc).__name__}: {exc}")
                print(f"warning: checkpoint not written: {exc}", file=sys.stderr, flush=True)
            # Sign the audit log's head with the round's checkpoint: a log cut later shows it.
            self.audit.checkpoint()
        _failpoint(events)
        if self.progress is not None:
            self.progress.events(events, self.machine.history)
        if events:
            self._notify()


def _marks_progress(event: Event, machine: RoundMachine) -> bool:
    """Whether an event changes what a restarted coordinator must know, short of a new state.

    A new group-key setup run must not reuse the number of one begun before a restart. The
    metrics silos report for the previous round arrive before they advertise keys, so they are
    all in once the advertise stage closes (a silo also sends them again in a retried attempt);
    the final round's reports come while finishing, from silos that then leave.
    """
    return (event.kind in ("group_setup_started", "federation_done")
            or (event.kind == "stage_closed" and event.fields.get("stage") == "advertise")
            or (event.kind == "metrics" and machine.stage is Stage.FINISHING))


def _failpoint(events: list[Event]) -> None:
    """SIGKILL this process after an event a test names in TRELLIS_COORDINATOR_FAILPOINT.

    The value is ``event:round``, ``stage_closed/stage:round`` or ``event`` (any round); unset
    (always, outside the restart tests), nothing happens. A test uses it to crash the
    coordinator at an exact point.
    """
    spec = os.environ.get("TRELLIS_COORDINATOR_FAILPOINT", "")
    if not spec:
        return
    name, _, at = spec.partition(":")
    kind, _, stage = name.partition("/")
    for event in events:
        if (event.kind == kind and (not at or str(event.fields.get("round")) == at)
                and (not stage or event.fields.get("stage") == stage)):
            os.kill(os.getpid(), signal.SIGKILL)
