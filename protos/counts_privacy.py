"""Differential privacy of summed evaluation counts ([metrics] aggregate = true with [privacy]).

The counts a silo appends to its masked vector (protos/metrics_plan.py) are released once per
round, over the silo's whole validation and test splits: not subsampled (q = 1). One example
moves them by at most `counts_sensitivity` integer units, so they get the same mechanism as the
shared vector with their own noise multiplier z_m (`metrics.noise_multiplier`): a discrete
Gaussian share of std z_m * Delta2 / sqrt(t - c) per silo ("ddg"), or the full z_m * Delta2 on
every silo ("local-gaussian"). The silo's ledger composes this release with the model's in every
round it takes part in (silo/privacy/budget.py), and with it alone in the attempt after the
last round, which sums the final state's counts and trains nothing; the coordinator's projection
does the same from public numbers (coordinator/rounds/privacy_report.py). No I/O.
"""

from __future__ import annotations

import math

from trellis.crypto.dp_accountant import RoundEvent
from trellis.protos.metrics_plan import counts_sensitivity, metric_slots
from trellis.protos.plan import PublicPlan


def counts_share_sigma(plan: PublicPlan) -> float:
    """The noise std (integer units) one silo adds to its counts' slots (0: not private)."""
    privacy, metrics = plan.privacy, plan.metrics
    if not (privacy.enabled and metrics.aggregate):
        return 0.0
    full = metrics.noise_multiplier * counts_sensitivity(metrics)[0]
    if privacy.mechanism != "ddg":
        return full
    return full / math.sqrt(privacy.honest_shares(plan.aggregation.threshold))


def counts_event(plan: PublicPlan, honest_shares: int) -> RoundEvent | None:
    """One round's release of the summed counts, with `honest_shares` honest noise shares in
    the sum (None: the plan releases none under privacy)."""
    sigma = counts_share_sigma(plan)
    if sigma == 0:
        return None
    if plan.privacy.mechanism != "ddg":
        return RoundEvent("local-gaussian", 1.0, 1,
                          noise_multiplier=plan.metrics.noise_multiplier)
    l2, l1 = counts_sensitivity(plan.metrics)
    # add_noise draws with sigma^2 rounded up to an integer: account the variance drawn.
    return RoundEvent("ddg", 1.0, 1, local_sigma2=float(math.ceil(sigma * sigma)),
                      honest_shares=honest_shares, l2_sensitivity=l2, l1_sensitivity=l1,
                      dim=len(metric_slots(plan.metrics)))
