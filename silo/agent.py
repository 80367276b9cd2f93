"""The silo agent behind ``silo join``: dials the coordinator over mTLS and drives a SiloSession.

The agent is the silo's transport: it reads instructions from its control stream, calls the
session for everything protocol- or ML-related, and records in its own audit trail every tensor
and key that leaves the silo (names, shapes, sizes and digests, never values).
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from trellis.crypto.audit import AuditLog
from trellis.crypto.errors import CryptoError, ProtocolError
from trellis.crypto.pki import Identity
from trellis.protos import codec
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos.files import write_atomic
from trellis.protos.messages import Envelope, Instruction, Phase
from trellis.silo import failpoints
from trellis.silo.session import IN_ATTEMPT, SiloSession, SiloStage
from trellis.silo.trainer import snapshot_from_bytes, snapshot_to_bytes

AGENT_VERSION = "trellis/0.1"
RESUME_FILE = "resume.pt"      # DESIGN.md §6: the silo's model and round counter, on its disk
# Refusals of a data call that mean "this attempt is over", not "you are not welcome".
_ROUND_MOVED_ON = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS)


class FederationFailed(RuntimeError):
    """The coordinator ended the federation without completing it, or refused this silo."""


class SiloAgent:
    """Connects, follows instructions until FINISHED, and keeps the silo's audit trail."""

    def __init__(self, target: str, identity: Identity, session: SiloSession, state_dir: Path,
                 *, connect_timeout_s: float = 300.0, log: Callable[[str], None] = print,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.target = target
        self.identity = identity
        self.session = session
        self.state_dir = state_dir
        self.connect_timeout_s = connect_timeout_s
        self.log = log
        self.sleep = sleep
        state_dir.mkdir(parents=True, exist_ok=True)
        self.audit = AuditLog(state_dir / "audit.jsonl", writer=identity.name,
                              signing_key_pem=identity.key_pem)
        self.federation = ""
        self._done: set[tuple[Phase, int, int]] = set()    # group-key and similarity steps
        self._resume_checked = False

    def run(self) -> None:
        """Take part until the federation finishes; reconnects with backoff if the link drops."""
        deadline = time.monotonic() + self.connect_timeout_s
        backoff = 0.5
        try:
            while True:
                try:
                    if self._session_over_channel():
                        return
                    backoff = 0.5
                    deadline = time.monotonic() + self.connect_timeout_s
                except grpc.RpcError as exc:
                    code = exc.code()
                    if code in (grpc.StatusCode.PERMISSION_DENIED,
                                grpc.StatusCode.UNAUTHENTICATED,
                                grpc.StatusCode.FAILED_PRECONDITION):
                        raise FederationFailed(f"coordinator refused this silo: {exc.details()}"
                                               ) from None
                    if code is not grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                        raise FederationFailed(f"lost the coordinator at {self.target}: "
                                               f"{code.name} {exc.details()}") from None
                    self.log(f"coordinator unavailable ({exc.details()}); retrying in "
                             f"{backoff:.1f}s")
                    self.sleep(backoff)
                    backoff = min(backoff * 2, 10.0)
        finally:
            self.audit.close()

    # -- one connection -----------------------------------------------------------------------
    def _session_over_channel(self) -> bool:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.identity.ca_pem, private_key=self.identity.key_pem,
            certificate_chain=self.identity.cert_pem)
        with grpc.secure_channel(self.target, credentials) as channel:
            stub = pb_grpc.FederationStub(channel)
            stream = stub.Attend(codec.attend_request(
                Envelope(self.federation, 0, 0, Phase.JOIN), AGENT_VERSION))
            inbox: queue.Queue[Instruction | grpc.RpcError | None] = queue.Queue()
            reader = threading.Thread(target=_read_stream, args=(stream, inbox), daemon=True)
            reader.start()
            try:
                while True:
                    instruction = _latest(inbox)
                    try:
                        if self._handle(stub, instruction):
                            return True
                    except grpc.RpcError as exc:
                        if exc.code() not in _ROUND_MOVED_ON:
                            raise
                        # The coordinator aborted or re-opened the round meanwhile: drop this
                        # attempt and follow the next instruction (a retry restores our state).
                        self.log(f"round moved on: {exc.details()}")
                        self.session.abort()
                    except (CryptoError, ValueError) as exc:
                        # A forged key, a NaN in the model, a bad plan: stop, upload nothing.
                        self.audit.append("refused_to_continue", reason=str(exc))
                        raise FederationFailed(f"stopped before uploading: {exc}") from None
            finally:
                stream.cancel()

    def _handle(self, stub: pb_grpc.FederationStub, ins: Instruction) -> bool:
        """Act on one instruction; True when the federation is over for this silo."""
        env = ins.envelope
        session = self.session
        if env.phase is Phase.JOIN:
            plan = session.accept_plan(ins.public_plan_json)
            if session.run_id and ins.run_id != session.run_id:
                raise ProtocolError("the coordinator started this federation afresh meanwhile; "
                                    "restart this silo to join the new run")
            session.run_id = ins.run_id
            self.federation = plan.federation
            self.audit.append("joined", coordinator=self.target, federation=plan.federation,
                              algorithm=plan.algorithm, rounds=plan.rounds)
            self.log(f"joined federation {plan.federation} ({plan.algorithm}, "
                     f"{plan.rounds} rounds) as {self.identity.name}")
            if not self._resume_checked:
                self._resume_checked = True
                self._resume_from_disk()
            return False
        if env.phase is Phase.WAITING:
            if session.stage in IN_ATTEMPT:
                # Left out of the current stage (too slow, or the attempt was aborted): this
                # silo must not send anything more for the attempt; its keys are forgotten.
                self.audit.append("left_attempt", round=session.round, attempt=session.attempt,
                                  stage=session.stage.value)
                session.abort()
            self.log(ins.message)
            return False
        if env.phase is Phase.ROUND_OPEN:
            if (env.round, env.attempt) == (session.round, session.attempt):
                return False           # already working on it (re-sent after a reconnect)
            self._open_round(stub, ins)
            return False
        step = self._STEPS.get(env.phase)
        if step is not None:
            due, action = step
            if session.stage is due and (env.round, env.attempt) == (session.round,
                                                                     session.attempt):
                action(self, stub, ins)
            return False
        group_step = self._GROUP_STEPS.get(env.phase)
        if group_step is not None:
            key = (env.phase, env.round, env.attempt)
            if key not in self._done:       # the same instruction is re-sent on reconnecting
                group_step(self, stub, ins)
                self._done.add(key)
            return False
        if env.phase is Phase.ROUND_ABORTED:
            session.abort()
            raise FederationFailed(f"the coordinator ended the federation: {ins.message}")
        if env.phase is Phase.FINISHED:
            self._finish(stub, env)
            return True
        self.log(f"ignoring instruction with phase {env.phase.name}")
        return False

    def _open_round(self, stub: pb_grpc.FederationStub, ins: Instruction) -> None:
        env = ins.envelope
        session = self.session
        session.open_round(ins)
        state = self._fetch_state(stub, replace(env, phase=Phase.FETCH_STATE))
        session.load_state(state)
        if session.exchanges_envelopes:
            self._fetch_pool(stub, replace(env, phase=Phase.FETCH_STATE))
        self._report(stub, env.round - 1)
        self._save_resume_state()
        advert = session.advert()
        self._call(stub.AdvertiseKey, codec.advert_to_pb(advert))
        self.audit.append("sent_keys", round=env.round, attempt=env.attempt,
                          cipher_key_sha256=hashlib.sha256(advert.cipher_key).hexdigest(),
                          mask_key_sha256=hashlib.sha256(advert.mask_key).hexdigest())

    def _share_and_train(self, stub: pb_grpc.FederationStub, ins: Instruction) -> None:
        env = ins.envelope
        bundle = codec.bundle_from_pb(self._call(stub.FetchKeys, codec.stage_request(env)))
        sealed = self.session.share_keys(bundle)
        self._call(stub.UploadShares, codec.shares_to_pb(sealed))
        self.audit.append("sent_shares", round=env.round, attempt=env.attempt,
                          receivers=[s.receiver for s in sealed.shares],
                          bytes=sum(len(s.box) for s in sealed.shares))
        failpoints.reached("after_shares", env.round)
        started = time.monotonic()
        stats = self.session.train()
        self.log(f"round {env.round}/{ins.total_rounds} attempt {env.attempt}: trained in "
                 f"{time.monotonic() - started:.2f}s, loss {stats.get('train_loss', 0):.4f}")

    def _submit(self, stub: pb_grpc.FederationStub, ins: Instruction) -> None:
        env = ins.envelope
        sealed = codec.shares_from_pb(self._call(stub.FetchShares, codec.stage_request(env)))
        trainer = self.session.trainer
        if failpoints.dump_shared_wanted() and trainer is not None:
            np.savez(self.state_dir / f"shared_r{env.round}_a{env.attempt}.npz",
                     vector=trainer.get_shared(), weight=trainer.num_train)
        masked = self.session.masked_input(sealed)
        statistics = self.session.update_statistics()
        upload_env = replace(env, phase=Phase.MASKED_INPUT)
        envelope = self.session.sealed_coefficients
        if envelope is not None:
            blobs = {"envelope": envelope}
            self._call(stub.UploadEnvelope, codec.blobs_to_chunks(blobs, upload_env))
            self.audit.append("sent_envelope", round=env.round, attempt=env.attempt,
                              bytes=len(envelope), sha256=codec.blobs_digest(blobs))
        self._call(stub.UploadMasked, codec.tensor_to_chunks("masked_input", masked, upload_env,
                                                             statistics=statistics))
        self.audit.append("sent_tensor", round=env.round, attempt=env.attempt,
                          tensor="masked_input", dtype=masked.dtype.name,
                          shape=list(masked.shape), bytes=int(masked.nbytes),
                          sha256=hashlib.sha256(masked.tobytes()).hexdigest(),
                          shares_from=[s.sender for s in sealed.shares],
                          **({"plain_statistics": statistics} if statistics else {}))
        failpoints.reached("after_masked_input", env.round)

    def _sign(self, stub: pb_grpc.FederationStub, ins: Instruction) -> None:
        signed = self.session.sign_survivors(ins)
        self._call(stub.SignSurvivors, codec.signed_survivors_to_pb(signed))
        self.audit.append("signed_survivors", round=ins.envelope.round,
                          attempt=ins.envelope.attempt, survivors=list(ins.participants))

    def _reveal(self, stub: pb_grpc.FederationStub, ins: Instruction) -> None:
        env = ins.envelope
        unmask = codec.unmask_from_pb(self._call(stub.FetchUnmaskRequest,
                                                 codec.stage_request(env)))
        failpoints.reached("during_unmask", env.round)
        try:
            revealed = self.session.reveal(unmask)
        except CryptoError as exc:
            self.audit.append("refused_unmask", round=env.round, attempt=env.attempt,
                              reason=str(exc))
            raise
        self._call(stub.RevealShares, codec.revealed_to_pb(revealed))
        self.audit.append("revealed_shares", round=env.round, attempt=env.attempt,
                          seed_shares_of=list(unmask.request.seed_shares_of),
                          key_shares_of=list(unmask.request.key_shares_of))

    # -- silo group key (before round 1) and GCFL similarity (when a split is due) ------------
    def _setup_key(self, stub: pb_grpc.FederationStub, ins: Instruction) -> None:
        advert = self.session.setup_advert(ins)
        self._call(stub.AdvertiseSetup, codec.setup_key_to_pb(ins.envelope, advert))
        self.audit.append("sent_setup_key", silos=list(ins.participants),
                          sha256=hashlib.sha256(advert).hexdigest())

    def _seal_group(self, stub: pb_grpc.FederationStub, ins: Instruction) -> None:
        env = ins.envelope
        _, bundle = codec.setup_bundle_from_pb(self._call(stub.FetchSetupBundle,
                                                          codec.stage_request(env)))
        boxes, public_context = self.session.seal_group(bundle)
        blobs = {**{f"box/{peer}": box for peer, box in boxes.items()},
                 "ckks_public": public_context}
        self._call(stub.UploadGroupSeal, codec.blobs_to_chunks(blobs, env))
        self.audit.append("sealed_group_secrets", receivers=sorted(boxes),
                          ckks_public_bytes=len(public_context),
                          bytes=sum(len(b) for b in blobs.values()),
                          sha256=codec.blobs_digest(blobs))

    def _open_group(self, stub: pb_grpc.FederationStub, ins: Instruction) -> None:
        env = ins.envelope
        _, box, leader_advert, leader_cert = codec.group_box_from_pb(
            self._call(stub.FetchGroupBox, codec.stage_request(env)))
        self.session.open_group(box, leader_advert, leader_cert)
        self._call(stub.ConfirmGroupOpen, codec.stage_request(env))
        self.audit.append("opened_group_secrets", box_sha256=hashlib.sha256(box).hexdigest())

    def _encrypt_update(self, stub: pb_grpc.FederationStub, ins: Instruction) -> None:
        env = ins.envelope
        if not self.session.has_update():
            # Restarted after training: the update is gone. The coordinator skips this split
            # when its deadline passes; the next round is normal.
            self.log(f"round {env.round}: no update to encrypt (this process did not train "
                     "it); the coordinator will skip this split")
            return
        ciphertexts = self.session.encrypted_update(ins)
        blobs = codec.numbered_blobs("ciphertext", ciphertexts)
        self._call(stub.UploadEncryptedUpdate, codec.blobs_to_chunks(blobs, env))
        self.audit.append("sent_encrypted_update", round=env.round, attempt=env.attempt,
                          cluster=list(ins.participants), ciphertexts=len(blobs),
                          bytes=sum(len(b) for b in blobs.values()),
                          sha256=codec.blobs_digest(blobs))

    def _decrypt_similarities(self, stub: pb_grpc.FederationStub, ins: Instruction) -> None:
        env = ins.envelope
        _, blobs = codec.chunks_to_blobs(stub.FetchBlinded(codec.stage_request(env),
                                                           timeout=600), max_bytes=1 << 31)
        blinded = {codec.pair_of(name): blob for name, blob in blobs.items()}
        values = self.session.decrypt_similarities(blinded)
        self._call(stub.UploadSimilarities, codec.similarities_to_pb(env, values))
        self.audit.append("decrypted_similarities", round=env.round, attempt=env.attempt,
                          pairs=len(values), received_sha256=codec.blobs_digest(blobs))

    _GROUP_STEPS: dict[Phase, Callable[..., None]] = {
        Phase.GROUP_SETUP: _setup_key,
        Phase.GROUP_SEAL: _seal_group,
        Phase.GROUP_OPEN: _open_group,
        Phase.ENCRYPT_UPDATE: _encrypt_update,
        Phase.DECRYPT_SIMILARITY: _decrypt_similarities,
    }

    # What each coordinator phase asks of a silo, and the stage the silo must be in to do it.
    _STEPS: dict[Phase, tuple[SiloStage, Callable[..., None]]] = {
        Phase.KEYS_READY: (SiloStage.OPEN, _share_and_train),
        Phase.SHARES_READY: (SiloStage.TRAINED, _submit),
        Phase.CONSISTENCY_CHECK: (SiloStage.SUBMITTED, _sign),
        Phase.UNMASK: (SiloStage.SIGNED, _reveal),
    }

    def _finish(self, stub: pb_grpc.FederationStub, env: Envelope) -> None:
        state = self._fetch_state(stub, replace(env, phase=Phase.FETCH_STATE))
        self.session.load_state(state)
        self._report(stub, env.round)
        self.session.finish()
        trainer = self.session.trainer
        if trainer is not None:
            path = self.state_dir / "final_model.pt"
            path.write_bytes(trainer.to_bytes())
            self.audit.append("saved_model", path=str(path))
        # Finished: a later run of this state folder must not continue from mid-federation.
        (self.state_dir / RESUME_FILE).unlink(missing_ok=True)
        self.log("federation finished")

    # -- the silo's own disk ------------------------------------------------------------------
    def _save_resume_state(self) -> None:
        """Keep the pre-round model, optimiser, random streams and round counter on disk."""
        blob = snapshot_to_bytes(self.session.resume_state())
        path = self.state_dir / RESUME_FILE
        try:
            write_atomic(path, lambda handle: handle.write(blob))
        except OSError as exc:
            raise ValueError(f"cannot keep this silo's state in {path}: {exc.strerror}; free "
                             "the disk or pass another --state-dir") from None

    def _resume_from_disk(self) -> None:
        """After a restart, continue from the state an earlier process saved for this plan."""
        path = self.state_dir / RESUME_FILE
        if not path.exists():
            return
        try:
            saved = snapshot_from_bytes(path.read_bytes())
        except Exception as exc:  # torch.load raises several types for a damaged file
            raise ValueError(f"{path} cannot be read ({type(exc).__name__}: {exc}); move it "
                             "away to start this silo afresh") from None
        if saved.get("federation") != self.federation or (
                saved.get("run_id") != self.session.run_id):
            # Another federation, or a run the coordinator has since started afresh.
            self.log(f"{path} is from another run (federation {saved.get('federation')!r}); "
                     "starting afresh")
            path.unlink()
            return
        try:
            self.session.resume(saved)
        except ProtocolError as exc:
            raise ValueError(f"{path}: {exc}; move it away to start this silo afresh") from None
        self.audit.append("resumed", round=self.session.round, attempt=self.session.attempt)
        self.log(f"resumed from {path}: state from before round {self.session.round}")

    def _fetch_state(self, stub: pb_grpc.FederationStub, env: Envelope) -> np.ndarray | None:
        chunks = stub.FetchState(codec.stage_request(env))
        _, name, tensor = codec.chunks_to_tensor(chunks, max_bytes=1 << 31)
        self.audit.append("received_tensor", round=env.round, tensor=name,
                          shape=list(tensor.shape),
                          sha256=hashlib.sha256(tensor.tobytes()).hexdigest())
        return None if name == "none" else tensor

    def _fetch_pool(self, stub: pb_grpc.FederationStub, env: Envelope) -> None:
        chunks = list(stub.FetchPool(codec.stage_request(env), timeout=600))
        # In round 1 (or when alone) nobody has sealed an envelope yet: an empty stream.
        blobs = codec.chunks_to_blobs(chunks, max_bytes=1 << 31)[1] if chunks else {}
        envelopes = codec.numbered_values("envelope", blobs)
        if envelopes is None:
            raise ProtocolError(f"the coordinator's envelope pool has entries {list(blobs)[:3]}")
        pooled = self.session.load_pool(envelopes)
        self.audit.append("received_envelopes", round=env.round, envelopes=len(blobs),
                          pooled_vectors=pooled, sha256=codec.blobs_digest(blobs))

    def _report(self, stub: pb_grpc.FederationStub, round_completed: int) -> None:
        # Sent again in a retried attempt: a restarted coordinator may have lost the first
        # copy; one that has it answers ALREADY_EXISTS.
        report = self.session.metrics_report(round_completed, again=True)
        if report is None:
            return
        try:
            self._call(stub.ReportMetrics, codec.metrics_to_pb(report))
        except grpc.RpcError as exc:
            if exc.code() is grpc.StatusCode.ALREADY_EXISTS:
                return
            # Metrics are optional: a refusal must not stop training.
            self.log(f"metrics for round {round_completed} not accepted: {exc.details()}")
            return
        self.audit.append("sent_metrics", round=round_completed, metrics=report.metrics)

    def _call(self, method: Callable[..., Any], request: object) -> Any:
        return method(request, timeout=600)


def _read_stream(stream: Iterator, inbox: queue.Queue) -> None:
    try:
        for message in stream:
            inbox.put(codec.instruction_from_pb(message))
        inbox.put(None)
    except grpc.RpcError as exc:
        inbox.put(exc)


def _latest(inbox: queue.Queue) -> Instruction:
    """Next instruction to act on: a JOIN first, else the newest (older ones are superseded)."""
    items = [inbox.get()]
    while True:
        try:
            items.append(inbox.get_nowait())
        except queue.Empty:
            break
    for item in items:
        if isinstance(item, grpc.RpcError):
            raise item
        if item is None:
            raise _StreamClosed()
    joins = [i for i in items if i.envelope.phase is Phase.JOIN]
    rest = [i for i in items if i.envelope.phase is not Phase.JOIN]
    if joins and rest:
        # Put the newest non-join back for the next call.
        inbox.put(rest[-1])
    return joins[0] if joins else rest[-1]


class _StreamClosed(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "control stream closed by the coordinator"

