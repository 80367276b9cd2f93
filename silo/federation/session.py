"""The silo's side of a federation as a state machine without I/O (STYLE.md 4).

The silo driver (silo/federation/driver.py) drives it, over gRPC in `silo join` and in memory in a
simulation. It checks every instruction against its own stage, so it never uploads a key, a
masked vector or metrics outside the stage they belong to, and it restores its pre-round
snapshot when a round attempt is retried.

The silo group key and what its secrets protect (FedHGN's envelopes, GCFL's encrypted
similarity) are silo/federation/silo_group.py; the session decides when each of those is due.

Over 400 lines because one silo's protocol state (the attempt's stage, its secure-aggregation
keys, the privacy budget, the snapshot to restore) is checked and moved by every step of a round
and saved whole for a restart; split across modules, those steps would share that mutable state
through back references.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from trellis.crypto.dp_encoding import to_ring
from trellis.crypto.errors import ProtocolError
from trellis.crypto.fixedpoint import FixedPointSpec
from trellis.crypto.keyagreement import KeyAdvert, RoundContext
from trellis.crypto.pki import Identity
from trellis.crypto.randomness import RandomSource
from trellis.crypto.secagg import RelayedAdvert, SecAggConfig
from trellis.crypto.secagg_client import SecAggClient
from trellis.protos.algorithms import MIN_SPLIT_SIZE, NODE_TASK, Algorithm, algorithm
from trellis.protos.messages import (
    Envelope,
    Instruction,
    KeyAdvertisement,
    KeyBundle,
    MetricsReport,
    Phase,
    RevealedShares,
    SealedShares,
    SignedSurvivors,
    UnmaskInstruction,
)
from trellis.protos.plan import PublicPlan, default_threshold
from trellis.silo.data.molecules.dataset_check import DatasetMismatch, reference_problem
from trellis.silo.federation.reported_metrics import (
    DEFAULT_REPORT,
    default_report,
    evaluate_for_report,
    metric_problem,
    report_warning,
    with_counts,
)
from trellis.silo.federation.saved_progress import read_saved
from trellis.silo.federation.silo_group import SiloGroup
from trellis.silo.federation.summed_metrics import SummedMetrics
from trellis.silo.privacy.budget import SiloBudget
from trellis.silo.privacy.policy import PlanRefused, Policy, check_plan
from trellis.silo.privacy.private_step import (
    add_noise,
    clip_vector,
    noise_source_for,
    to_integers,
)
from trellis.silo.training.hgn_trainer import HeteroTrainer
from trellis.silo.training.trainer import LocalTrainer

Trainer = LocalTrainer | HeteroTrainer

class SiloStage(enum.Enum):
    """Where this silo is within a round attempt (crypto/secagg.py describes the stages)."""

    IDLE = "idle"
    OPEN = "open"              # state loaded (and, when aggregating, keys advertised)
    SHARED = "shared"          # sealed key shares sent
    TRAINED = "trained"
    SUBMITTED = "submitted"    # masked input sent
    SIGNED = "signed"          # survivor list signed
    REVEALED = "revealed"      # shares revealed, or trained and reported when nothing is
                               # aggregated: this silo's part of the round is over
    FINISHED = "finished"


# Stages in which the silo is inside an attempt that may still need it.
IN_ATTEMPT = (SiloStage.OPEN, SiloStage.SHARED, SiloStage.TRAINED, SiloStage.SUBMITTED,
              SiloStage.SIGNED)
# Asked to sign the survivor list: the coordinator had this silo's masked input (U3), so an
# attempt closed now still counts it; so does one closed while its shares are being revealed
# (REVEALED is set before the reveal goes out, as SUBMITTED is before the upload, which may be
# refused: not counted). A trained report of an algorithm that aggregates nothing is never
# refused this way: the link answers False.
INPUT_COUNTED = (SiloStage.SIGNED, SiloStage.REVEALED)


class SiloSession:
    """One silo's participation: keys, shares, training, masking, unmasking, reporting."""

    def __init__(self, identity: Identity, make_trainer: Callable[[PublicPlan], Trainer],
                 report: Sequence[str] | None = None, policy: Policy | None = None,
                 noise_source: RandomSource | None = None,
                 dataset_fingerprint: str | None = None) -> None:
        self.identity = identity
        # The reference-set fingerprint of the dataset this silo trains on ("" if it records
        # none), checked against a plan's [data] reference_sha256; None: not checked (callers
        # that do not load a dataset folder: simulations, tests).
        self.dataset_fingerprint = dataset_fingerprint
        # The operator's limits on plans (silo/privacy/policy.py); None: any.
        self.policy = policy
        # A standing silo's job: the public plan it approved; any other is refused ("": any).
        self.approved_plan_sha256 = ""
        # Private randomness for differential privacy (samples, noise): the operating system's
        # unless a test passes a source or the insecure seed variable is set.
        self.noise_seeded = False
        if noise_source is None:
            noise_source, self.noise_seeded = noise_source_for(identity.name, os.environ)
        self.noise_source: RandomSource = noise_source
        self.budget: SiloBudget | None = None     # this silo's privacy accounting, if any
        self._private_sum: np.ndarray | None = None   # this attempt's rounded, un-noised sum
        self.privacy_record: dict[str, Any] | None = None   # the last accounted round's
        self.name = identity.name
        self._make_trainer = make_trainer
        # None: `default_report` of the plan, once it is known; else the operator's choice.
        self.report_chosen = report is not None
        self.report_names = DEFAULT_REPORT if report is None else tuple(report)
        self.plan: PublicPlan | None = None
        # The coordinator's run of the federation (told on joining): every advert, survivor
        # signature and group-key box of this silo is bound to it (crypto/keyagreement.py).
        self.run_id = ""
        self.trainer: Trainer | None = None
        self.stage = SiloStage.IDLE
        self.round = 0
        self.attempt = 0
        self.participants: tuple[str, ...] = ()
        self._secagg: SecAggClient | None = None
        self._snapshot: tuple[int, dict[str, Any]] | None = None
        self._last_train: dict[str, float] = {}
        self.reported: set[int] = set()
        # Rounds whose result this silo's input went into, as far as it knows (it signed the
        # survivor list, or trained and reported when nothing is aggregated): only their
        # metrics are sent. A restarted process does not know about the round it died in.
        self.took_part: set[int] = set()
        self.last_metrics: dict[str, float] = {}      # the last report's values (kept home)
        self.own_metrics: dict[str, float] = {}       # all of the last round's figures (home)
        # The silo group key and what it opens (silo/federation/silo_group.py).
        self.group = SiloGroup(identity)
        self.sealed_coefficients: bytes | None = None   # this attempt's envelope (FedHGN)
        # [metrics] aggregate: counts ride the masked vector; an attempt announced after the
        # last round (total_rounds below its round) trains nothing, only sums the final counts.
        self.summed: SummedMetrics | None = None
        self.evaluating = False

    # -- joining ------------------------------------------------------------------------------
    def accept_plan(self, public_plan_json: str) -> PublicPlan:
        """Validate the plan received on joining, check it against the silo's policy
        (PlanRefused, before anything is built or sent) and build the local trainer."""
        plan = PublicPlan.from_json(public_plan_json)
        if self.approved_plan_sha256 and plan.sha256() != self.approved_plan_sha256:
            raise ProtocolError("the coordinator sent a plan other than the one this silo "
                                f"approved (sha256 {plan.sha256()[:16]}..., approved "
                                f"{self.approved_plan_sha256[:16]}...); nothing was sent")
        if self.dataset_fingerprint is not None:
            problem = reference_problem(plan.reference_sha256, self.dataset_fingerprint,
                                        "this silo's dataset")
            if problem:
                raise DatasetMismatch(f"{problem}; nothing was sent")
        if self.policy is not None:
            violations = check_plan(self.policy, plan)
            if violations:
                raise PlanRefused(plan, violations, self.policy)
        if self.plan is not None and plan != self.plan:
            raise ProtocolError("the coordinator sent a different plan on reconnecting")
        if self.trainer is None:
            trainer = self._make_trainer(plan)
            if plan.training.validation_metric == "roc_auc" and (
                    problem := metric_problem(plan, self.name, trainer.num_classes)):
                raise ValueError(problem)      # before anything is sent
            if not self.report_chosen:
                self.report_names = default_report(plan)
            self.summed = SummedMetrics.for_plan(plan, self.name, trainer)
            if (algorithm(plan.algorithm).exchanges_envelopes and not plan.privacy.enabled
                    and isinstance(trainer, HeteroTrainer)):
                count = len(trainer.coefficient_rows())
                slots = plan.hetero.coefficient_slots
                if count > slots:
                    raise ProtocolError(
                        f"this silo's graph has {count} relations, more than the plan's "
                        f"{slots} coefficient envelope slots (fedhgn.coefficient_slots); the "
                        "coordinator must raise it for this silo to take part")
            self.plan, self.trainer = plan, trainer
            if plan.privacy.enabled:
                self.budget = SiloBudget(plan, self.policy, graphs=trainer.num_train,
                                         dimension=self._private_dimension(trainer),
                                         shared_values=trainer.layout.length)
                self.budget.check_plan()      # PlanRefused before anything is sent
        return plan

    def report_warning(self) -> str:
        """A line for the operator when the plan selects rounds by a metric this silo's
        --report leaves out ("" otherwise)."""
        summed = self.plan is None or self.summed is not None    # nothing reported: no warning
        return "" if summed else report_warning(self._plan(), self.report_names)

    def _private_dimension(self, trainer: Trainer) -> int:
        """The values one private record moves: every trained value, or the shared ones."""
        if self._plan().privacy.unit == "silo":
            return trainer.layout.length
        return self._local_trainer().trainable_values

    @property
    def spec(self) -> FixedPointSpec:
        """Fixed-point encoding from the plan."""
        agg = self._plan().aggregation
        return FixedPointSpec(agg.clip, agg.fraction_bits, agg.ring_bits, agg.max_sample_count)

    # -- a round ------------------------------------------------------------------------------
    def open_round(self, instruction: Instruction) -> None:
        """Start (or restart) a round attempt: restore the pre-round state if this is a retry."""
        env = instruction.envelope
        if env.phase is not Phase.ROUND_OPEN:
            raise ProtocolError(f"open_round needs ROUND_OPEN, got {env.phase.name}")
        if (env.round, env.attempt) <= (self.round, self.attempt):
            raise ProtocolError(f"{env.describe()} is not after round {self.round} attempt "
                                f"{self.attempt}")
        if self.name not in instruction.participants:
            raise ProtocolError("this silo is not among the round's participants")
        trainer = self._trainer()
        self.evaluating = (self.summed is not None and 0 < instruction.total_rounds < env.round)
        if self.budget is not None:
            # Before anything of this round is computed or sent: never after the fact.
            self.budget.check_round(env.round, model=not self.evaluating)
        if self._snapshot is not None and self._snapshot[0] == env.round:
            trainer.restore(self._snapshot[1])
        else:
            self._snapshot = (env.round, trainer.snapshot())
        self.round, self.attempt = env.round, env.attempt
        self.participants = instruction.participants
        self.stage = SiloStage.OPEN
        if not self.algorithm.aggregates:
            self._secagg = None         # nothing leaves the silo: no keys, no masks
            return
        agg = self._plan().aggregation
        threshold, neighbours = agg.threshold, agg.neighbours
        if self.clustered:
            # One aggregation per cluster: a majority of the cluster, over its full graph.
            threshold, neighbours = default_threshold(len(self.participants)), 0
        self._secagg = SecAggClient(self.name, self._context(),
                                    SecAggConfig(threshold, neighbours, self._plan().seed),
                                    self.identity.key_pem, self.identity.ca_pem)

    @property
    def algorithm(self) -> Algorithm:
        """The plan's algorithm: its row decides what this silo does and shares."""
        return algorithm(self._plan().algorithm)

    @property
    def clustered(self) -> bool:
        """Whether the plan's algorithm aggregates per cluster (GCFL)."""
        return self.algorithm.clustered

    def load_state(self, state: np.ndarray | None) -> None:
        """Load the shared state received for this round (None: keep the current values)."""
        if state is None:
            return
        if self.clustered or self._private_aggregation():
            # GCFL sends cumulative updates; a private federation the offset from the initial
            # shared values the plan's seed gives every silo.
            self._trainer().set_cluster_state(state)
        else:
            self._trainer().set_shared(state)

    @property
    def exchanges_envelopes(self) -> bool:
        """Whether silos swap sealed coefficient envelopes (FedHGN, never with privacy)."""
        return self.algorithm.exchanges_envelopes and not self._plan().privacy.enabled

    def load_pool(self, envelopes: Sequence[bytes]) -> int:
        """Open the other silos' envelopes and pool their real records for the alignment loss;
        returns how many coefficient vectors the pool holds."""
        if not self.exchanges_envelopes:
            if envelopes:
                raise ProtocolError(f"{self._plan().algorithm} exchanges no envelopes")
            return 0
        rows = self.group.open_coefficients(self._plan(), self.run_id, envelopes)
        trainer = self._hetero_trainer()
        if len(rows):
            trainer.set_pool(rows)
        else:
            trainer.reset_pool()      # no peer has sent coefficients yet
        return len(rows)

    def _seal_coefficients(self) -> bytes:
        plan = self._plan()
        return self.group.seal_coefficients(plan, self.run_id,
                                            self._hetero_trainer().coefficient_rows())

    def advert(self) -> KeyAdvertisement:
        """This attempt's two signed public keys."""
        signed = self._client(SiloStage.OPEN, "a key advert").advert()
        return KeyAdvertisement(self._envelope(Phase.ADVERTISE_KEY), signed.cipher_key,
                                signed.mask_key, signed.signature,
                                self._trainer().layout.length)

    def share_keys(self, bundle: KeyBundle) -> SealedShares:
        """Verify every advert, then seal Shamir shares of this attempt's secrets for peers."""
        client = self._client(SiloStage.OPEN, "key sharing")
        self._check_envelope(bundle.envelope, Phase.KEYS_READY)
        names = {k.silo for k in bundle.keys}
        if not names <= set(self.participants):
            raise ProtocolError("the key bundle lists silos outside the round's participants")
        relayed = [RelayedAdvert(KeyAdvert(k.silo, k.cipher_key, k.mask_key, k.signature),
                                 k.certificate_pem) for k in bundle.keys]
        sealed = client.share_keys(relayed)
        holders = len(client.neighbours) + 1
        if 2 * client.config.threshold <= holders:
            # A coordinator lowering the threshold could unmask a silo from two disjoint groups.
            raise ProtocolError(f"threshold {client.config.threshold} is not a majority of the "
                                f"{holders} holders of this silo's shares; refusing to share")
        self.stage = SiloStage.SHARED
        return SealedShares(self._envelope(Phase.SHARE_KEYS), tuple(sealed))

    def train(self) -> dict[str, float]:
        """Local training for this round: after the key shares are out, or at once when the
        algorithm aggregates nothing."""
        due = SiloStage.SHARED if self.algorithm.aggregates else SiloStage.OPEN
        if self.stage is not due:
            raise ProtocolError(f"training is not due in stage {self.stage.value}")
        if self.evaluating:     # nothing trained: zeros (and noise) in the model's part
            self._last_train = {}
            self._private_sum = np.zeros(self._trainer().layout.length, np.int64)
        elif self.budget is not None:
            self._last_train = self._train_private()
        else:
            self._last_train = self._trainer().train()
        self.stage = SiloStage.TRAINED
        return self._last_train

    def _private_aggregation(self) -> bool:
        plan = self._plan()
        return plan.privacy.enabled and self.algorithm.aggregates

    def _train_private(self) -> dict[str, float]:
        """Differential privacy: the round's clipped sum, rounded, with the local slice's step
        taken; what is shared gets its noise share when it is masked. No loss is reported: a
        figure of the private sample would leave the silo without noise."""
        assert self.budget is not None
        step = self.budget.step
        trainer = self._trainer()
        if step.unit == "record":
            self._private_sum = self._local_trainer().train_private(step, self.noise_source)
        else:
            before = trainer.get_shared()
            trainer.train()
            update = clip_vector(trainer.get_shared().astype(np.float64) - before, step.clip)
            self._private_sum = to_integers(update, step.scale)
        if not self.algorithm.aggregates:
            # Local training: the model itself is what the guarantee covers; no sum, no peers.
            self._private_sum = None
            self.privacy_record = self.budget.record_round(self.round, 1)
        return {}

    def trained_report(self) -> MetricsReport:
        """An algorithm that aggregates nothing: this round's metrics, which tell the
        coordinator the silo has trained; the silo's part of the attempt is then over."""
        if self.algorithm.aggregates or self.stage is not SiloStage.TRAINED:
            raise ProtocolError(f"a trained report is not due in stage {self.stage.value}")
        report = self.metrics_report(self.round, again=True)
        if report is None:
            raise ProtocolError("no round is open")
        self.stage = SiloStage.REVEALED
        self.took_part.add(self.round)
        # Bound to the attempt it answers: a late report of an aborted attempt is refused.
        return replace(report, envelope=replace(report.envelope, attempt=self.attempt))

    def masked_input(self, sealed: SealedShares) -> np.ndarray:
        """Keep the shares peers sent, then encode and mask this silo's shared vector."""
        client = self._client(SiloStage.TRAINED, "a masked input")
        self._check_envelope(sealed.envelope, Phase.SHARES_READY)
        trainer = self._trainer()
        zeros = np.zeros(trainer.layout.length, np.float32)
        if self.budget is not None:
            masked = client.mask_input(self._with_counts(self._private_upload()), sealed.shares)
            self.sealed_coefficients = None
            self.stage = SiloStage.SUBMITTED
            return masked
        if self.evaluating or (self.clustered and self.participants == (self.name,)):
            # Training nothing, or alone in its cluster: the silo keeps its own update;
            # sending it would reveal it.
            upload, weight = zeros, 1
        else:
            upload, weight = trainer.upload_vector(), trainer.num_train
        if not self._plan().aggregation.unweighted_sum:
            encoded = self.spec.encode(upload, weight)
        elif len(self.participants) >= MIN_SPLIT_SIZE:
            # GCFL's split test needs the unweighted mean as well as the weighted one.
            encoded = self.spec.encode_both(upload, weight)
        else:
            # A group too small to split reveals no unweighted sum: zeros in its place.
            encoded = np.concatenate([self.spec.encode(upload, weight),
                                      self.spec.encode(zeros, 1)])
        masked = client.mask_input(self._with_counts(encoded), sealed.shares)
        self.sealed_coefficients = (self._seal_coefficients() if self.exchanges_envelopes
                                    else None)
        self.stage = SiloStage.SUBMITTED
        return masked

    def _private_upload(self) -> np.ndarray:
        """This silo's rounded sum plus its noise share, as ring elements (no weight)."""
        assert self.budget is not None
        if self._private_sum is None:
            raise ProtocolError("no private sum: this silo has not trained in this attempt")
        noisy = add_noise(self._private_sum, self.budget.step.share_sigma, self.noise_source)
        return to_ring(noisy, self._plan().aggregation.ring_bits)

    def _with_counts(self, ring: np.ndarray) -> np.ndarray:
        """[metrics] aggregate: the evaluation counts' slots after the vector."""
        return ring if not self.summed else self.summed.after(ring, self.round, self.noise_source)

    def update_statistics(self) -> dict[str, float]:
        """GCFL's plain per-silo norms sent with the masked input (a documented leak)."""
        return dict(self._trainer().update_statistics) if self.clustered else {}

    # -- the silo's own disk (DESIGN.md §6) ---------------------------------------------------
    def resume_state(self) -> dict[str, Any]:
        """What a restarted process of this silo needs to go on: its model, optimiser and random
        streams from before the current round, the round counter and which rounds it reported.
        Kept on the silo's own disk only; never sent."""
        if self._snapshot is None:
            raise ProtocolError("no round has been opened yet")
        plan = self._plan()
        # The group secrets are the silo's to keep, like its certificate key: without them a
        # restarted silo could not open envelopes or take part in a split.
        secrets = b"" if self.group.secrets is None else self.group.secrets.to_bytes()
        return {"federation": plan.federation, "run_id": self.run_id, "plan": plan.to_json(),
                "round": self.round,
                "attempt": self.attempt, "snapshot_round": self._snapshot[0],
                "snapshot": self._snapshot[1], "reported": sorted(self.reported),
                "took_part": sorted(self.took_part),
                "group_secrets": torch.from_numpy(np.frombuffer(secrets, np.uint8).copy()),
                "privacy_budget": "" if self.budget is None else self.budget.to_json()}

    def final_state(self) -> dict[str, Any] | None:
        """The resume state after the last round, with the trained model: what this silo needs
        to go on if the coordinator operator extends the federation. None before any round."""
        if self._snapshot is None:
            return None
        return {**self.resume_state(), "snapshot_round": self.round + 1,
                "snapshot": self._trainer().snapshot(), "finished": True}

    def resume(self, saved: Mapping[str, Any]) -> None:
        """Continue from a `resume_state` an earlier process of this silo wrote (the agent has
        checked that it belongs to this run of the federation)."""
        progress = read_saved(saved, self._plan())
        self._trainer().restore(progress.snapshot)
        self._snapshot = (progress.snapshot_round, progress.snapshot)
        self.round, self.attempt = progress.round, progress.attempt
        self.reported, self.took_part = progress.reported, progress.took_part
        self.group.secrets = progress.group
        if self.budget is not None:
            budget = saved.get("privacy_budget", "")
            if not budget:
                raise ProtocolError("the saved silo state has no privacy accounting for this "
                                    "private plan")
            self.budget.restore(str(budget))
        self.stage = SiloStage.IDLE

    # -- silo group key ---------------------------------------------------------------------
    def setup_advert(self, instruction: Instruction) -> bytes:
        """A signed setup key for the silo group key (the leader also draws the secrets)."""
        plan = self._plan()
        return self.group.setup_advert(plan.federation, self.run_id, instruction,
                                       self.algorithm.needs_ckks)

    def seal_group(self, bundle: dict[str, tuple[bytes, bytes]]) -> tuple[dict[str, bytes], bytes]:
        """Leader: verify each peer's advert and seal the group secrets for it."""
        return self.group.seal(bundle)

    def open_group(self, box: bytes, leader_advert: bytes, leader_certificate: bytes) -> None:
        """Member: verify the leader's advert against its certificate and open the box."""
        self.group.open(box, leader_advert, leader_certificate)

    # -- GCFL similarity --------------------------------------------------------------------
    def has_update(self) -> bool:
        """Whether this process trained in the current round (a restarted one has not)."""
        trainer = self._trainer()
        return isinstance(trainer, LocalTrainer) and trainer.last_update is not None

    def encrypted_update(self, instruction: Instruction) -> list[bytes]:
        """This round's update, normalised and encrypted under the group's CKKS key."""
        env = instruction.envelope
        if (env.round, env.attempt) != (self.round, self.attempt) or self.name not in (
                instruction.participants):
            raise ProtocolError(f"{env.describe()} asks for an update this silo did not make")
        update = self._local_trainer().last_update
        if update is None:
            raise ProtocolError("no update in this round to encrypt")
        return self.group.encrypt_update(update)

    def decrypt_similarities(self, blinded: dict[tuple[str, str], bytes]
                             ) -> dict[tuple[str, str], float]:
        """Decrypt blinded inner products (single values only; never a whole vector)."""
        return self.group.decrypt_similarities(blinded)

    def sign_survivors(self, instruction: Instruction) -> SignedSurvivors:
        """Sign the list of silos whose masked input the coordinator says it holds."""
        client = self._client(SiloStage.SUBMITTED, "a consistency signature")
        self._check_envelope(instruction.envelope, Phase.CONSISTENCY_CHECK)
        signature = client.sign_survivors(instruction.participants)
        if self.budget is not None:
            # The sum about to be unmasked holds exactly these inputs: account with them.
            self.privacy_record = self.budget.record_round(self.round,
                                                           len(instruction.participants),
                                                           model=not self.evaluating)
        self.stage = SiloStage.SIGNED
        self.took_part.add(self.round)
        return SignedSurvivors(self._envelope(Phase.SIGN_SURVIVORS), signature)

    def reveal(self, unmask: UnmaskInstruction) -> RevealedShares:
        """Reveal seed shares of survivors and key shares of dropped silos, never both."""
        client = self._client(SiloStage.SIGNED, "revealed shares")
        self._check_envelope(unmask.envelope, Phase.UNMASK)
        shares = client.reveal(unmask.request)
        self._secagg = None
        self.stage = SiloStage.REVEALED
        return RevealedShares(self._envelope(Phase.REVEAL_SHARES), tuple(shares))

    def abort(self) -> None:
        """This attempt is over for this silo: forget its keys; the snapshot stays for a retry."""
        self._secagg = None
        self.stage = SiloStage.IDLE

    def metrics_report(self, round_completed: int, *, again: bool = False
                       ) -> MetricsReport | None:
        """Metrics for a completed round after loading its state (None if nothing to report,
        or if already reported and not asked `again`)."""
        if round_completed < 1 or (round_completed in self.reported and not again):
            return None
        # Everything is evaluated, reported or not: the silo keeps its own figures at home.
        values, own = evaluate_for_report(self._trainer(), self._last_train, self.summed,
                                          round_completed)
        # An undefined figure (a one-class split's ROC-AUC: NaN) says nothing: not reported.
        chosen = {k: float(values[k]) for k in self.report_names if k in values
                  and not math.isnan(values[k])}
        if self.algorithm.task == NODE_TASK:
            chosen = with_counts(chosen, values)
        self.reported.add(round_completed)
        self.last_metrics, self.own_metrics = chosen, own
        envelope = Envelope(self._plan().federation, round_completed, 0, Phase.REPORT)
        return MetricsReport(envelope, chosen)

    def finish(self) -> None:
        """Mark the federation as finished for this silo."""
        self.stage = SiloStage.FINISHED

    # -- helpers ------------------------------------------------------------------------------
    def _client(self, stage: SiloStage, what: str) -> SecAggClient:
        if self.stage is not stage or self._secagg is None:
            raise ProtocolError(f"{what} is not due in stage {self.stage.value}")
        return self._secagg

    def _check_envelope(self, env: Envelope, phase: Phase) -> None:
        if (env.round, env.attempt, env.phase) != (self.round, self.attempt, phase):
            raise ProtocolError(f"{env.describe()} does not match round {self.round} attempt "
                                f"{self.attempt} phase {phase.name}")

    def _context(self) -> RoundContext:
        return RoundContext(self._plan().federation, self.round, self.attempt, run=self.run_id)

    def _envelope(self, phase: Phase) -> Envelope:
        return Envelope(self._plan().federation, self.round, self.attempt, phase)

    def _plan(self) -> PublicPlan:
        if self.plan is None:
            raise ProtocolError("no plan received yet")
        return self.plan

    def _trainer(self) -> Trainer:
        if self.trainer is None:
            raise ProtocolError("no plan received yet")
        return self.trainer

    def _local_trainer(self) -> LocalTrainer:
        trainer = self._trainer()
        if not isinstance(trainer, LocalTrainer):
            raise ProtocolError(f"{self._plan().algorithm} does not train graph classifiers")
        return trainer

    def _hetero_trainer(self) -> HeteroTrainer:
        trainer = self._trainer()
        if not isinstance(trainer, HeteroTrainer):
            raise ProtocolError(f"{self._plan().algorithm} has no schema coefficients")
        return trainer
