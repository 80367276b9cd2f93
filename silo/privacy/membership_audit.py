"""Loss-threshold membership inference: how well a model's per-graph losses tell its training
graphs from graphs it never saw (Yeom et al. 2018). An AUC of 0.5 means they cannot."""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata


def loss_threshold_auc(member_losses: np.ndarray, other_losses: np.ndarray) -> float:
    """AUC of the attack 'lower loss means member', over every threshold (ties count half)."""
    members = np.asarray(member_losses, np.float64).ravel()
    others = np.asarray(other_losses, np.float64).ravel()
    if not members.size or not others.size:
        raise ValueError("a membership audit needs both member and non-member losses")
    if not (np.isfinite(members).all() and np.isfinite(others).all()):
        raise ValueError("a membership audit needs finite losses")
    # Mann-Whitney: the chance that a random member scores above a random non-member, the score
    # being the negated loss.
    ranks = rankdata(-np.concatenate([members, others]))
    member_rank_sum = float(ranks[: members.size].sum())
    u = member_rank_sum - members.size * (members.size + 1) / 2
    return u / (members.size * others.size)
