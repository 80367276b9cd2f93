"""Thread-safe home of the round machine inside the server: audit trail, checkpoints, waiting.

gRPC handlers call these methods; each applies one input to the machine under a lock, appends
the resulting events to the audit log, prints progress, checkpoints completed rounds and wakes
the control streams waiting for a new instruction.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trellis.coordinator.errors import InvalidPayload
from trellis.coordinator.progress import Progress
from trellis.coordinator.rounds import Event, RoundMachine, RoundRecord, Stage
from trellis.crypto.audit import AuditLog
from trellis.crypto.pki import certificate_fingerprint
from trellis.crypto.secagg import RevealedShare
from trellis.protos.codec import blobs_digest, numbered_values
from trellis.protos.files import write_atomic, write_json_atomic
from trellis.protos.messages import (
    Envelope,
    Instruction,
    KeyAdvertisement,
    KeyBundle,
    MetricsReport,
    SealedShares,
    SignedSurvivors,
    UnmaskInstruction,
)
from trellis.protos.plan import Plan

CHECKPOINT = "checkpoint.json"
GLOBAL_STATE = "global_state.npy"       # name in checkpoints written before the state files
                                        # carried their round count (_state_names)


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
        self._next_token = 0
        self.stopping = False

    # -- presence -----------------------------------------------------------------------------
    def connect(self, silo: str, certificate_pem: bytes) -> int:
        """A silo's control stream opened; returns a token for `disconnect`."""
        with self._cond:
            if silo in self._connections:
                # A new stream while the old one still looks open: a restarted silo process
                # (its keys are gone) or a reconnect. Either way the old stream is over.
                self._end_stream(silo, replaced=True)
            self._next_token += 1
            self._connections[silo] = self._next_token
            self.audit.append("connected", silo=silo,
                              certificate=certificate_fingerprint(certificate_pem))
            self._apply(self.machine.join(silo, certificate_pem, self.clock()))
            return self._next_token

    def disconnect(self, silo: str, token: int) -> None:
        """A control stream ended; the silo leaves unless a newer stream replaced it."""
        with self._cond:
            if self._connections.get(silo) == token:
                self._end_stream(silo)

    def _end_stream(self, silo: str, **fields: Any) -> None:
        """Forget the silo's stream; it leaves the federation until it attends again."""
        del self._connections[silo]
        if self.stopping:
            return          # streams torn down by shutdown; the audit log is closed
        self.audit.append("disconnected", silo=silo, **fields)
        self._apply(self.machine.leave(silo, self.clock()))

    def wait_instruction(self, silo: str, last: Instruction | None,
                         timeout: float) -> Instruction:
        """The silo's current instruction, waiting up to timeout for it to differ from last."""
        with self._cond:
            current = self.machine.instruction(silo)
            if current == last and not self.stopping:
                self._cond.wait(timeout)
                current = self.machine.instruction(silo)
            return current

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
                              sha256=hashlib.sha256(vector.tobytes()).hexdigest())
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
            self._cond.notify_all()

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
        _failpoint(events)
        if self.progress is not None:
            self.progress.events(events, self.machine.history)
        if events:
            self._cond.notify_all()


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


@dataclass(frozen=True)
class Resume:
    """Where a restarted coordinator picks up: the checkpoint of a plan's earlier run."""

    next_round: int
    global_state: np.ndarray | None
    history: list[RoundRecord]
    attempts_opened: int        # attempts of `next_round` opened before the restart
    setup_generation: int       # group-key setup runs begun before the restart
    durable: dict[str, Any] | None     # RoundMachine.durable_state(), JSON part (None: lost)
    durable_arrays: dict[str, np.ndarray]
    run_id: str


def save_checkpoint(state_dir: Path, machine: RoundMachine, *, with_state: bool = True) -> None:
    """Record completed rounds, the open attempt, the global state and the rest of the
    machine's durable state (DESIGN.md §6), so that a crash at any moment leaves one
    consistent checkpoint.

    The state files carry the number of completed rounds in their names and are written first;
    ``checkpoint.json``, written last, names the ones that belong to it, and older ones are
    removed only after it. ``with_state=False`` rewrites only the JSON document: the state files
    change only when a round completes or an attempt opens.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    history = machine.completed_history
    global_name, durable_name = _state_names(len(history))
    if with_state:
        state = machine.global_state
        if state is not None:
            write_atomic(state_dir / global_name, lambda handle: np.save(handle, state))
        doc, arrays = machine.durable_state()
        stored: dict[str, Any] = {"__doc__": np.frombuffer(json.dumps(doc).encode(), np.uint8),
                                  **arrays}
        write_atomic(state_dir / durable_name, lambda handle: np.savez(handle, **stored))
    write_json_atomic(state_dir / CHECKPOINT, {
        "federation": machine.plan.federation,
        "algorithm": machine.plan.public.algorithm,
        "plan": json.loads(machine.plan.public.to_json()),
        "run_id": machine.run_id,
        "completed_rounds": len(history),
        "state_files": {"global": global_name if machine.global_state is not None else None,
                        "durable": durable_name},
        "open_attempt": {"round": machine.round, "attempt": machine.attempt},
        "setup_generation": machine.setup_generation,
        "history": [_record_json(r) for r in history],
    })
    if with_state:
        for old in state_dir.glob("*_state-*.np[yz]"):
            if old.name not in (global_name, durable_name):
                old.unlink(missing_ok=True)


def _state_names(completed_rounds: int) -> tuple[str, str]:
    """The global-state and durable-state file names of a checkpoint."""
    return (f"global_state-{completed_rounds}.npy", f"durable_state-{completed_rounds}.npz")


def load_checkpoint(state_dir: Path, plan: Plan) -> Resume | None:
    """Where to resume this plan from its state directory's checkpoint, or None to start afresh.

    A checkpoint of another plan is refused unless it has no completed round (nothing is lost
    by starting that federation again).
    """
    path = state_dir / CHECKPOINT
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
        same_plan = doc.get("plan") == json.loads(plan.public.to_json())
        history_json = list(doc["history"])
    except (OSError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _unreadable(path, exc) from None
    if not same_plan and history_json:
        raise ValueError(f"{path} belongs to a different plan; move it away or use a new "
                         "server.state_dir")
    if not same_plan:
        return None
    try:
        files = doc.get("state_files") or {
            "global": GLOBAL_STATE if doc.get("has_global_state") else None, "durable": None}
        state = np.load(state_dir / files["global"]) if files["global"] else None
        history = [RoundRecord(r["round"], r["attempts"], tuple(r["participants"]),
                               r["total_weight"], r["started"], r["finished"], r["metrics"],
                               tuple(r.get("dropped", ())))
                   for r in history_json]
        opened = doc.get("open_attempt") or {}
        next_round = len(history) + 1
        attempts = int(opened.get("attempt", 0)) if opened.get("round") == next_round else 0
        durable: dict[str, Any] | None = None
        arrays: dict[str, np.ndarray] = {}
        if files["durable"] and (state_dir / files["durable"]).exists():
            with np.load(state_dir / files["durable"], allow_pickle=False) as stored:
                arrays = {k: stored[k] for k in stored.files if k != "__doc__"}
                durable = json.loads(stored["__doc__"].tobytes().decode())
        elif not history:
            durable = {}           # nothing completed yet: nothing durable to lose
        return Resume(next_round, state, history, attempts, int(doc.get("setup_generation", 0)),
                      durable, arrays, str(doc.get("run_id") or ""))
    except (OSError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _unreadable(path, exc) from None


def _unreadable(path: Path, exc: Exception) -> ValueError:
    return ValueError(f"{path} cannot be read back ({type(exc).__name__}: {exc}); move the "
                      "state directory away to start again")


def discard_state_files(state_dir: Path) -> None:
    """Remove the state files of an earlier run before a federation starts afresh."""
    for path in (state_dir / CHECKPOINT, state_dir / GLOBAL_STATE,
                 *state_dir.glob("*_state-*.np[yz]")):
        path.unlink(missing_ok=True)



def _record_json(record: RoundRecord) -> dict[str, Any]:
    return {"round": record.round, "attempts": record.attempts,
            "participants": list(record.participants), "total_weight": record.total_weight,
            "started": record.started, "finished": record.finished, "metrics": record.metrics,
            "dropped": list(record.dropped)}
