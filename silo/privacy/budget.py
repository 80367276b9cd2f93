"""A silo's own privacy budget: its epsilon from its own sampling rate, enforced before a round.

The silo accounts for its own records only, from public numbers (the plan's noise, its own
Poisson rate, how many noise shares each unmasked sum held) and nothing data-dependent: no
norms, no sample sizes, no seeds. Before each round it asks whether that round could take its
epsilon past its limit, assuming the fewest honest noise shares the round could end with, and
stops the federation there rather than after the fact (silo/privacy/dp_policy.py). After a sum is
about to be unmasked it records the round with the inputs that actually survived.

With [metrics] aggregate = true the masked vector also carries the silo's evaluation counts,
released every round with their own noise (protos/counts_privacy.py): each round then
records two events, composed in the one ledger, and the attempt after the last round, which
trains nothing, records the counts' event alone.

No I/O; the silo's agent writes `record_round`'s return value to its audit log.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, replace
from typing import Any

from trellis.crypto.dp_accountant import (
    PrivacyLedger,
    RoundEvent,
    accountant_version,
    ddg_event,
)
from trellis.protos.counts_privacy import counts_event, counts_share_sigma
from trellis.protos.plan import PublicPlan
from trellis.silo.privacy.policy import PlanRefused, Policy
from trellis.silo.privacy.private_step import PrivateStep, private_step
from trellis.silo.privacy.violations import Violation


class BudgetExhausted(Exception):
    """The next round could take this silo past its privacy budget: it stops before it."""

    def __init__(self, round_no: int, epsilon_now: float, epsilon_after: float,
                 limit: float, delta: float) -> None:
        self.round = round_no
        self.epsilon_now, self.epsilon_after, self.limit = epsilon_now, epsilon_after, limit
        super().__init__(
            f"privacy budget: round {round_no} could take this silo's epsilon from "
            f"{epsilon_now:.3g} to {epsilon_after:.3g} (delta {delta:g}), past its limit "
            f"{limit:g}; the silo stops before training for it")

    def record(self) -> dict[str, Any]:
        """The audit trail's form."""
        return {"round": self.round, "epsilon": round(self.epsilon_now, 6),
                "epsilon_after": round(self.epsilon_after, 6), "max_epsilon": self.limit}


@dataclass(frozen=True)
class BudgetLimit:
    """The epsilon a silo will not exceed, and where it comes from."""

    epsilon: float
    source: str          # "policy" (privacy.max_epsilon) or "plan" (privacy.epsilon)


class SiloBudget:
    """One silo's privacy accounting over a federation."""

    def __init__(self, plan: PublicPlan, policy: Policy | None, *, graphs: int,
                 dimension: int, shared_values: int) -> None:
        self.plan = plan
        self.policy = policy
        self.privacy = plan.privacy
        self.graphs = graphs
        self.step: PrivateStep = private_step(plan.privacy,
                                              threshold=plan.aggregation.threshold,
                                              dimension=dimension, graphs=graphs)
        self.ledger = PrivacyLedger(accountant=plan.privacy.accountant)
        self.rounds: list[dict[str, Any]] = []
        self.has_local_slice = dimension > shared_values

    # -- limits ---------------------------------------------------------------------------------
    @property
    def limit(self) -> BudgetLimit | None:
        """The policy's max_epsilon if it has one; else none (the plan's target is a design)."""
        dp = None if self.policy is None else self.policy.privacy
        if dp is not None and dp.max_epsilon is not None:
            return BudgetLimit(dp.max_epsilon, "policy")
        return None

    def _event(self, honest_shares: int) -> RoundEvent:
        """A round with `honest_shares` noise shares in the unmasked sum (ddg), or local noise.

        Record level, the local slice's noise is fixed at the floor's total before the round,
        so surplus survivors add noise to the shared slice only; the whole vector is then no
        better protected than at the floor, and is accounted so."""
        step = self.step
        if step.mechanism != "ddg":
            if self.ledger.accountant == "pld":
                # Its noise is discrete too: one share, at least (z Delta2)^2 per coordinate.
                return replace(ddg_event(step.encoding, 1, step.sampling_rate),
                               local_sigma2=step.full_sigma ** 2)
            return RoundEvent("local-gaussian", step.sampling_rate, 1,
                              noise_multiplier=step.noise_multiplier)
        if step.unit == "record" and self.has_local_slice:
            honest_shares = min(honest_shares, self.floor_shares)
        event = ddg_event(step.encoding, honest_shares, step.sampling_rate)
        if step.unit == "record" and self.has_local_slice:
            # The local slice holds one draw of variance ceil(full_sigma^2), which rounding
            # sigma_l^2 up can leave below honest * sigma_l^2 (by 2^-20 at most): account the
            # smaller. A smaller sigma_l only loosens the bound on the shares' sum.
            local = min(event.local_sigma2, math.ceil(step.full_sigma ** 2) / honest_shares)
            event = replace(event, local_sigma2=local)
        return event

    @property
    def floor_shares(self) -> int:
        """The fewest honest noise shares any sum holding this silo's input can have."""
        return self.privacy.honest_shares(self.plan.aggregation.threshold)

    def epsilon(self) -> float:
        """This silo's epsilon so far, at the plan's delta."""
        return self.ledger.epsilon(self.privacy.delta)

    def projected_epsilon(self, rounds: int | None = None, *, model: bool = True) -> float:
        """Epsilon after `rounds` more rounds (default: the whole plan, with the attempt that
        sums the final counts) at the noise floor; `model` False: rounds that train nothing."""
        more = self.plan.rounds if rounds is None else rounds
        counts = counts_event(self.plan, self.floor_shares)
        if counts is None:
            return self.ledger.projected(self._event(self.floor_shares), more, self.privacy.delta)
        ledger = copy.deepcopy(self.ledger)     # the counts' rounds, then the model's
        ledger.record(replace(counts, steps=more + (1 if rounds is None else 0)))
        if not model:
            return ledger.epsilon(self.privacy.delta)
        return ledger.projected(self._event(self.floor_shares), more, self.privacy.delta)

    def last_affordable_round(self, limit: float) -> int:
        """The last round of the plan this silo can take part in within `limit` (0: none)."""
        lo, hi = 0, self.plan.rounds
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.projected_epsilon(mid) <= limit else (lo, mid - 1)
        return lo

    # -- joining ------------------------------------------------------------------------------
    def check_plan(self) -> None:
        """The policy's DP clauses, then its budget over the whole plan (PlanRefused)."""
        violations: list[Violation] = []
        p = self.privacy
        if p.unit == "record" and p.delta * self.graphs >= 1:
            violations.append(Violation(
                "privacy.delta", f"below 1/{self.graphs} (this silo's training graphs: a "
                "larger delta may reveal a whole graph)", f"{p.delta:g}"))
        limit = self.limit
        stops = self.policy is not None and self.policy.privacy.on_exhausted == "stop"
        if limit is not None and not stops:
            projected = self.projected_epsilon()
            if projected > limit.epsilon:
                violations.append(Violation(
                    "privacy.max_epsilon", f"at most {limit.epsilon:g}",
                    f"{self.plan.rounds} rounds at q = {self.step.sampling_rate:.4g} and "
                    f"z = {self.step.noise_multiplier:g}: epsilon {projected:.3g} for this "
                    "silo"))
        if violations:
            raise PlanRefused(self.plan, violations,
                              self.policy or Policy(source="trellis's own rule (no policy file)"))

    # -- rounds -------------------------------------------------------------------------------
    def check_round(self, round_no: int, *, model: bool = True) -> None:
        """Raise BudgetExhausted if this round could take the silo past its limit (`model`
        False: it trains nothing and releases only summed counts)."""
        limit = self.limit
        if limit is None:
            return
        after = self.projected_epsilon(1, model=model)
        if after > limit.epsilon:
            raise BudgetExhausted(round_no, self.epsilon(), after, limit.epsilon,
                                  self.privacy.delta)

    def record_round(self, round_no: int, inputs: int, *, model: bool = True
                     ) -> dict[str, Any]:
        """Account a round whose sum holds `inputs` inputs; its audit record (public only).
        `model` False: the attempt trains nothing and releases only summed counts."""
        honest = max(inputs - self.step.colluders, 1) if self.step.mechanism == "ddg" else 1
        if model:
            self.ledger.record(self._event(honest))
        counts = counts_event(self.plan, honest)
        if counts is not None:
            self.ledger.record(counts)
        summed = {} if counts is None else {
            "counts_noise_multiplier": self.plan.metrics.noise_multiplier,
            "counts_share_sigma": round(counts_share_sigma(self.plan), 6),
            "model_released": model}
        entry = {"round": round_no, **self.step.record(), **summed, "inputs": inputs,
                 "honest_shares": honest,
                 "noise_floor_held": honest >= self.floor_shares,
                 "delta": self.privacy.delta, "epsilon": round(self.epsilon(), 6),
                 "accountant": accountant_version(self.ledger.accountant)}
        self.rounds.append(entry)
        return entry

    # -- the silo's own disk ------------------------------------------------------------------
    def to_json(self) -> str:
        """What a restarted silo needs to go on accounting."""
        return json.dumps({"ledger": self.ledger.to_json(), "rounds": self.rounds})

    def restore(self, text: str) -> None:
        """Take back `to_json`'s state."""
        doc = json.loads(text)
        saved = PrivacyLedger.from_json(doc["ledger"])
        # The plan names the accountant; a ledger saved by an older silo has only its events.
        self.ledger = PrivacyLedger(saved.events, saved.orders, self.privacy.accountant)
        self.rounds = list(doc["rounds"])
