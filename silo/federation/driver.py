"""The silo's side of a federation, written once: acts on each instruction through a link.

``silo join`` runs it over gRPC (silo/federation/agent.py with silo/federation/grpc_link.py) and
``coordinator simulate`` runs it in one process (coordinator/simulation/sequential.py's in-process
link): the same lines decide what a silo fetches, computes, uploads and records. The protocol state
lives in the session (silo/federation/session.py); the driver sequences one instruction's calls and
writes the silo's audit trail of everything that leaves it or reaches it (names, shapes, sizes and
digests, never values). What is specific to a deployed silo (its disk, its resume file, its final
model) comes in through the two hooks.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from trellis.crypto.errors import CryptoError
from trellis.protos import codec
from trellis.protos.messages import Envelope, Instruction, Phase
from trellis.silo.federation import failpoints
from trellis.silo.federation.link import CoordinatorLink, RoundMovedOn
from trellis.silo.federation.session import IN_ATTEMPT, INPUT_COUNTED, SiloSession, SiloStage
from trellis.silo.training.devices import device_step
from trellis.silo.training.failures import FederationFailed


class AuditTrail(Protocol):
    """Where the driver records what left and reached the silo (crypto.audit.AuditLog)."""

    def append(self, event: str, **fields: Any) -> Any:
        """Record one event."""


class RoundObserver(Protocol):
    """What the driver tells an observer besides its audit trail (silo/operations/metrics.py)."""

    def trained(self, round: int, seconds: float) -> None:
        """Local training of a round (or a retried attempt of it) took seconds."""

    def round_completed(self, round: int) -> None:
        """The result of this round reached the silo."""


# Called with each completed round's number, the silo's own figures for it and the seconds its
# local training took (None when another process trained it): the silo's metrics file.
RoundDone = Callable[[int, dict[str, float], float | None], object]


class NoAudit:
    """An audit trail that keeps nothing (the one-process simulation has no reviewer)."""

    def append(self, event: str, **fields: Any) -> None:
        """Drop the record."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class SiloDriver:
    """Drives one silo's session through a link, one instruction at a time."""

    def __init__(self, session: SiloSession, link: CoordinatorLink, *,
                 audit: AuditTrail | None = None, log: Callable[[str], None] = print,
                 clock: Callable[[], float] = time.monotonic,
                 before_round: Callable[[], None] | None = None,
                 finished: Callable[[], None] | None = None,
                 dump_dir: Path | None = None,
                 observer: RoundObserver | None = None,
                 round_done: RoundDone | None = None) -> None:
        self.session = session
        self.link = link
        self.audit: AuditTrail = audit if audit is not None else NoAudit()
        self.log = log
        self.clock = clock
        self._before_round = before_round    # state loaded, before anything leaves the silo
        self._finished = finished            # after the final state and report
        self._dump_dir = dump_dir            # TRELLIS_DUMP_SHARED's folder (tests only)
        self._observer = observer            # operational metrics (silo join --metrics-listen)
        self._done: set[tuple[Phase, int, int]] = set()   # group-key and similarity steps
        self._round_done = round_done
        self._train_seconds: dict[int, float] = {}

    # -- one instruction ------------------------------------------------------------------------
    def handle(self, ins: Instruction) -> bool:
        """Act on one instruction; True when the federation is over for this silo.

        A refusal meaning "this attempt is over" drops the attempt (a retry restores the
        pre-round state) and is not an error.
        """
        try:
            return self._handle(ins)
        except RoundMovedOn as exc:
            where = f"round {ins.envelope.round} attempt {ins.envelope.attempt}"
            if self.session.stage in INPUT_COUNTED:
                # Routine for the slowest silo: unmasking needs only a threshold of share
                # reveals, so the coordinator may close the attempt before this one arrives.
                self.log(f"{where} closed before this silo's last step ({exc}); its masked "
                         "input was among the survivors', so the round counts it unless the "
                         "attempt is retried")
            else:
                # Too slow for a stage, or the attempt was retried without this silo.
                self.log(f"{where} went on without this silo ({exc}); it takes part again from "
                         "the next attempt")
            self.session.abort()
            return False

    def _handle(self, ins: Instruction) -> bool:
        env = ins.envelope
        session = self.session
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
            if (env.round, env.attempt) != (session.round, session.attempt):
                self._open_round(ins)      # else: already on it (re-sent after a reconnect)
            return False
        step = _SECURE_STEPS.get(env.phase)
        if step is not None:
            due, action = step
            if session.stage is due and (env.round, env.attempt) == (session.round,
                                                                     session.attempt):
                action(self, ins)
            return False
        group_step = _GROUP_STEPS.get(env.phase)
        if group_step is not None:
            key = (env.phase, env.round, env.attempt)
            if key not in self._done:       # the same instruction is re-sent on reconnecting
                group_step(self, ins)
                self._done.add(key)
            return False
        if env.phase is Phase.ROUND_ABORTED:
            session.abort()
            raise FederationFailed(f"the coordinator ended the federation: {ins.message}")
        if env.phase is Phase.FINISHED:
            self._finish(env)
            return True
        self.log(f"ignoring instruction with phase {env.phase.name}")
        return False

    # -- a round: secure aggregation with training between key sharing and the masked input ----
    def _open_round(self, ins: Instruction) -> None:
        env = ins.envelope
        session = self.session
        session.open_round(ins)
        session.load_state(self._fetch_state(replace(env, phase=Phase.FETCH_STATE)))
        if self._observer is not None and env.round > 1:
            self._observer.round_completed(env.round - 1)
        if session.exchanges_envelopes:
            self._fetch_pool(replace(env, phase=Phase.FETCH_STATE))
        # The last round's metrics (again after a retry or a restart: the coordinator may have
        # lost them; one that has them says so).
        self._report(env.round - 1)
        if self._before_round is not None:
            self._before_round()
        if not session.algorithm.aggregates:
            self._train_and_report(ins)
            return
        advert = session.advert()
        self.link.advertise(advert)
        self.audit.append("sent_keys", round=env.round, attempt=env.attempt,
                          cipher_key_sha256=_sha256(advert.cipher_key),
                          mask_key_sha256=_sha256(advert.mask_key))

    def _train_and_report(self, ins: Instruction) -> None:
        """Nothing is aggregated (`local`): train, then report the round's metrics, which is
        how the coordinator learns that this silo is done. No keys, no masks, no shares."""
        self._train(ins)
        self._audit_privacy(ins.envelope.attempt)
        report = self.session.trained_report()
        self._keep_figures(report.envelope.round)
        if self.link.report(report):
            self.audit.append("sent_metrics", round=report.envelope.round,
                              metrics=report.metrics)

    def _share_and_train(self, ins: Instruction) -> None:
        env = ins.envelope
        sealed = self.session.share_keys(self.link.fetch_keys(env))
        self.link.upload_shares(sealed)
        self.audit.append("sent_shares", round=env.round, attempt=env.attempt,
                          receivers=[s.receiver for s in sealed.shares],
                          bytes=sum(len(s.box) for s in sealed.shares))
        failpoints.reached("after_shares", env.round)
        self._train(ins)

    def _train(self, ins: Instruction) -> None:
        env = ins.envelope
        started = self.clock()
        with device_step(self._device(), f"round {env.round} local training"):
            stats = self.session.train()
        if self.session.evaluating:
            self.log(f"round {env.round - 1}: the final state's evaluation counts go into one "
                     "more secure sum; nothing is trained")
            return
        self._train_seconds[env.round] = seconds = self.clock() - started
        # A private round reports no loss: a figure of the private sample would leave unnoised.
        loss = f", loss {stats['train_loss']:.4f}" if "train_loss" in stats else ""
        self.log(f"round {env.round}/{ins.total_rounds} attempt {env.attempt}: trained in "
                 f"{seconds:.2f}s{loss}")
        if self._observer is not None:
            self._observer.trained(env.round, seconds)

    def _submit(self, ins: Instruction) -> None:
        env = ins.envelope
        sealed = self.link.fetch_shares(env)
        trainer = self.session.trainer
        if self._dump_dir is not None and failpoints.dump_shared_wanted() and trainer is not None:
            np.savez(self._dump_dir / f"shared_r{env.round}_a{env.attempt}.npz",
                     vector=trainer.get_shared(), weight=trainer.num_train)
        masked = self.session.masked_input(sealed)
        statistics = self.session.update_statistics()
        upload_env = replace(env, phase=Phase.MASKED_INPUT)
        envelope = self.session.sealed_coefficients
        if envelope is not None:
            self.link.upload_envelope(upload_env, envelope)
            self.audit.append("sent_envelope", round=env.round, attempt=env.attempt,
                              bytes=len(envelope),
                              sha256=codec.blobs_digest({"envelope": envelope}))
        self.link.upload_masked(upload_env, masked, statistics)
        self.audit.append("sent_tensor", round=env.round, attempt=env.attempt,
                          tensor="masked_input", dtype=masked.dtype.name,
                          shape=list(masked.shape), bytes=int(masked.nbytes),
                          sha256=_sha256(masked.tobytes()),
                          shares_from=[s.sender for s in sealed.shares],
                          **({"metric_slots": summed.slots}
                             if (summed := self.session.summed) is not None else {}),
                          **({"plain_statistics": statistics} if statistics else {}))
        failpoints.reached("after_masked_input", env.round)

    def _sign(self, ins: Instruction) -> None:
        signed = self.session.sign_survivors(ins)
        self.link.sign_survivors(signed)
        self.audit.append("signed_survivors", round=ins.envelope.round,
                          attempt=ins.envelope.attempt, survivors=list(ins.participants))
        self._audit_privacy(ins.envelope.attempt)

    def _audit_privacy(self, attempt: int) -> None:
        """The round's mechanism and this silo's epsilon so far (public numbers only)."""
        record = self.session.privacy_record
        if record is not None:
            self.audit.append("privacy_round", attempt=attempt, **record)
            self.log(f"round {record['round']}: privacy spent so far epsilon "
                     f"{record['epsilon']:.3g} (delta {record['delta']:g})")
            self.session.privacy_record = None

    def _reveal(self, ins: Instruction) -> None:
        env = ins.envelope
        unmask = self.link.fetch_unmask(env)
        failpoints.reached("during_unmask", env.round)
        try:
            revealed = self.session.reveal(unmask)
        except CryptoError as exc:
            self.audit.append("refused_unmask", round=env.round, attempt=env.attempt,
                              reason=str(exc))
            raise
        self.link.reveal(revealed)
        self.audit.append("revealed_shares", round=env.round, attempt=env.attempt,
                          seed_shares_of=list(unmask.request.seed_shares_of),
                          key_shares_of=list(unmask.request.key_shares_of))

    # -- silo group key (before round 1) and GCFL similarity (when a split is due) ------------
    def _setup_key(self, ins: Instruction) -> None:
        advert = self.session.setup_advert(ins)
        self.link.setup_advert(ins.envelope, advert)
        self.audit.append("sent_setup_key", silos=list(ins.participants),
                          sha256=_sha256(advert))

    def _seal_group(self, ins: Instruction) -> None:
        env = ins.envelope
        boxes, public_context = self.session.seal_group(self.link.setup_bundle(env))
        self.link.upload_group_seal(env, boxes, public_context)
        blobs = {**{f"box/{peer}": box for peer, box in boxes.items()},
                 "ckks_public": public_context}
        self.audit.append("sealed_group_secrets", round=env.round, attempt=env.attempt,
                          receivers=sorted(boxes),
                          ckks_public_bytes=len(public_context),
                          bytes=sum(len(b) for b in blobs.values()),
                          sha256=codec.blobs_digest(blobs))

    def _open_group(self, ins: Instruction) -> None:
        env = ins.envelope
        box, leader_advert, leader_cert = self.link.fetch_group_box(env)
        self.session.open_group(box, leader_advert, leader_cert)
        self.link.confirm_group_open(env)
        self.audit.append("opened_group_secrets", box_sha256=_sha256(box))

    def _encrypt_update(self, ins: Instruction) -> None:
        env = ins.envelope
        if not self.session.has_update():
            # Restarted after training: the update is gone. The coordinator skips this split
            # when its deadline passes; the next round is normal.
            self.log(f"round {env.round}: no update to encrypt (this process did not train "
                     "it); the coordinator will skip this split")
            return
        ciphertexts = self.session.encrypted_update(ins)
        self.link.upload_encrypted_update(env, ciphertexts)
        blobs = codec.numbered_blobs("ciphertext", ciphertexts)
        self.audit.append("sent_encrypted_update", round=env.round, attempt=env.attempt,
                          cluster=list(ins.participants), ciphertexts=len(blobs),
                          bytes=sum(len(b) for b in blobs.values()),
                          sha256=codec.blobs_digest(blobs))

    def _decrypt_similarities(self, ins: Instruction) -> None:
        env = ins.envelope
        blinded = self.link.fetch_blinded(env)
        values = self.session.decrypt_similarities(blinded)
        self.link.upload_similarities(env, values)
        received = {codec.pair_name(a, b): blob for (a, b), blob in blinded.items()}
        self.audit.append("decrypted_similarities", round=env.round, attempt=env.attempt,
                          pairs=len(values), received_sha256=codec.blobs_digest(received))

    # -- the end ------------------------------------------------------------------------------
    def _finish(self, env: Envelope) -> None:
        evaluated = self.session.summed is not None and self.session.round > env.round
        if self.session.algorithm.aggregates and not evaluated:
            # The final shared state, and the last round's metrics on it. An algorithm that
            # aggregates nothing has no state to fetch and reported with its last round, and a
            # silo that summed the final counts holds it already: the coordinator may be gone.
            self.session.load_state(self._fetch_state(replace(env, phase=Phase.FETCH_STATE)))
            self._report(env.round)
        self.session.finish()
        if self._observer is not None:
            self._observer.round_completed(env.round)
        if self._finished is not None:
            self._finished()
        self.log("federation finished")

    # -- what reaches the silo -------------------------------------------------------------------
    def _fetch_state(self, env: Envelope) -> np.ndarray | None:
        state = self.link.fetch_state(env)
        shown = np.zeros(0, np.float32) if state is None else state
        self.audit.append("received_tensor", round=env.round,
                          tensor="none" if state is None else "global_state",
                          shape=list(shown.shape), bytes=int(shown.nbytes),
                          sha256=_sha256(shown.tobytes()))
        return state

    def _fetch_pool(self, env: Envelope) -> None:
        envelopes = self.link.fetch_pool(env)
        pooled = self.session.load_pool(envelopes)
        blobs = codec.numbered_blobs("envelope", envelopes)
        self.audit.append("received_envelopes", round=env.round, envelopes=len(envelopes),
                          pooled_vectors=pooled, bytes=sum(len(e) for e in envelopes),
                          sha256=codec.blobs_digest(blobs))

    def _report(self, round_completed: int) -> None:
        # Sent again in a retried attempt: a restarted coordinator may have lost the first
        # copy; one that has it says so, and that is fine.
        with device_step(self._device(), f"evaluation after round {round_completed}"):
            report = self.session.metrics_report(round_completed, again=True)
        if report is None:
            return
        self._keep_figures(round_completed)
        if self.session.summed is not None:
            return      # its counts go into the next masked vector; no figure is sent
        if round_completed not in self.session.took_part:
            # Left out of that round (too slow, or restarted): its figures stay home; the
            # coordinator takes metrics only from a round's participants.
            self.log(f"round {round_completed}: metrics not reported (this silo has no record "
                     "of its input being in that round); they stay in its own metrics file")
            return
        if self.link.report(report):
            self.audit.append("sent_metrics", round=round_completed, metrics=report.metrics)

    def _device(self) -> object:
        return "cpu" if self.session.trainer is None else self.session.trainer.device

    def _keep_figures(self, round_completed: int) -> None:
        """Hand the round's own figures (all of them, reported or not) to the silo's disk."""
        if self._round_done is not None:
            self._round_done(round_completed, dict(self.session.own_metrics),
                             self._train_seconds.get(round_completed))


# What each coordinator phase asks of a silo, and the stage the silo must be in to do it.
_SECURE_STEPS: dict[Phase, tuple[SiloStage, Callable[[SiloDriver, Instruction], None]]] = {
    Phase.KEYS_READY: (SiloStage.OPEN, SiloDriver._share_and_train),
    Phase.SHARES_READY: (SiloStage.TRAINED, SiloDriver._submit),
    Phase.CONSISTENCY_CHECK: (SiloStage.SUBMITTED, SiloDriver._sign),
    Phase.UNMASK: (SiloStage.SIGNED, SiloDriver._reveal),
}
_GROUP_STEPS: dict[Phase, Callable[[SiloDriver, Instruction], None]] = {
    Phase.GROUP_SETUP: SiloDriver._setup_key,
    Phase.GROUP_SEAL: SiloDriver._seal_group,
    Phase.GROUP_OPEN: SiloDriver._open_group,
    Phase.ENCRYPT_UPDATE: SiloDriver._encrypt_update,
    Phase.DECRYPT_SIMILARITY: SiloDriver._decrypt_similarities,
}
