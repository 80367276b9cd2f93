"""What the coordinator says about a private plan: its projected epsilon, before round 1 and per
round (docs/privacy.md). Public numbers only; each silo accounts its own epsilon from its own
sampling rate (silo/privacy/budget.py). No I/O.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from trellis.crypto.dp_accountant import PrivacyLedger, RoundEvent, accountant_version
from trellis.protos.counts_privacy import counts_event
from trellis.protos.plan import Plan
from trellis.protos.privacy_plan import REFERENCE_SENSITIVITY, SILO_LEVEL_ADVISED, PrivacyConfig

# Silo sizes the start-up line projects epsilon for, besides the plan's design size.
_SIZES = (100, 1000, 10_000)


def _event(privacy: PrivacyConfig, graphs: int) -> RoundEvent:
    """A round at the noise floor for a silo of `graphs` graphs. The coordinator cannot know a
    silo's dimension, so the ddg bound is taken for one coordinate at the reference integer
    sensitivity, as the plan's calibration takes it (each silo accounts exactly)."""
    rate, z = privacy.sampling_rate(graphs), privacy.noise_multiplier
    if privacy.mechanism != "ddg":
        return RoundEvent("local-gaussian", rate, 1, noise_multiplier=z)
    unit = REFERENCE_SENSITIVITY
    return RoundEvent("ddg", rate, 1, local_sigma2=(z * unit) ** 2, honest_shares=1,
                      l2_sensitivity=unit, l1_sensitivity=unit, dim=1)


def design_epsilon(plan: Plan, rounds: int, graphs: int | None = None,
                   final_counts: bool = True) -> float:
    """Epsilon after `rounds` rounds for a silo of the design size (or of `graphs` graphs),
    with the summed counts' releases where the plan has them: one per round and, with
    `final_counts`, the attempt after the last, which sums the final counts (as each silo
    accounts them)."""
    privacy = plan.public.privacy
    size = graphs if graphs is not None else max(privacy.design_graphs, 1)
    ledger = PrivacyLedger(accountant=privacy.accountant)
    floor = privacy.honest_shares(plan.public.aggregation.threshold)
    counts = counts_event(plan.public, floor)
    if counts is not None:
        ledger.record(replace(counts, steps=rounds + int(final_counts)))
    return ledger.projected(_event(privacy, size), rounds, privacy.delta)


def privacy_summary(plan: Plan) -> dict[str, Any]:
    """The plan's mechanism and projected epsilon, for the audit log's `serve` record (nothing
    for a plan without privacy)."""
    privacy = plan.public.privacy
    if not privacy.enabled:
        return {}
    threshold = plan.public.aggregation.threshold
    return {"privacy": {
        "mechanism": privacy.mechanism, "unit": privacy.unit, "clip": privacy.clip,
        "bits": privacy.bits, "noise_multiplier": privacy.noise_multiplier,
        "threshold": threshold, "colluders": privacy.colluders,
        "honest_shares_floor": privacy.honest_shares(threshold), "delta": privacy.delta,
        "design_graphs": privacy.design_graphs, "batch": privacy.batch,
        "projected_epsilon": round(design_epsilon(plan, plan.public.rounds), 6),
        "accountant": accountant_version(privacy.accountant)}}


def privacy_lines(plan: Plan) -> list[str]:
    """What the operator reads before round 1."""
    privacy = plan.public.privacy
    if not privacy.enabled:
        return []
    rounds = plan.public.rounds
    lines = []
    if privacy.unit == "record":
        sizes = sorted({privacy.design_graphs, *_SIZES} - {0})
        figures = ", ".join(f"{n} graphs: {design_epsilon(plan, rounds, n):.3g}" for n in sizes)
        lines.append(
            f"privacy: {privacy.mechanism}, one graph per record, z = "
            f"{privacy.noise_multiplier:g}, clip {privacy.clip:g}, {privacy.batch} graphs per "
            f"silo and round; projected epsilon after {rounds} rounds (delta "
            f"{privacy.delta:g}) for a silo of {figures}{_with_counts(plan)}. Each silo "
            "accounts its own.")
    else:
        lines.append(
            f"privacy: {privacy.mechanism}, one silo per record, z = "
            f"{privacy.noise_multiplier:g}, clip {privacy.clip:g}; projected epsilon after "
            f"{rounds} rounds (delta {privacy.delta:g}): "
            f"{design_epsilon(plan, rounds, 1):.3g}{_with_counts(plan)}")
        if len(plan.silos) < SILO_LEVEL_ADVISED:
            lines.append(f"privacy: silo-level noise with {len(plan.silos)} silos is large "
                         f"against the mean update; it is advised from about "
                         f"{SILO_LEVEL_ADVISED} silos (docs/privacy.md)")
    if privacy.mechanism == "ddg":
        threshold = plan.public.aggregation.threshold
        lines.append(f"privacy: every unmasked sum holds at least "
                     f"{privacy.honest_shares(threshold)} honest noise shares (threshold "
                     f"{threshold}, {privacy.colluders} colluding silos assumed)")
    return lines


def _with_counts(plan: Plan) -> str:
    """What the projection holds besides the model, if anything."""
    if counts_event(plan.public, 1) is None:
        return ""
    return (f" (the summed evaluation counts included, z_m = "
            f"{plan.public.metrics.noise_multiplier:g})")


def round_privacy(plan: Plan, completed_rounds: int, survivors: int) -> dict[str, Any]:
    """The `round_completed` record's privacy fields (public numbers only; none without)."""
    privacy = plan.public.privacy
    if not privacy.enabled:
        return {}
    threshold = plan.public.aggregation.threshold
    honest = max(survivors - privacy.colluders, 1) if privacy.mechanism == "ddg" else survivors
    return {"privacy": {"mechanism": privacy.mechanism, "survivors": survivors,
                        "honest_shares": honest,
                        "noise_floor_held": honest >= privacy.honest_shares(threshold),
                        "design_epsilon": round(design_epsilon(plan, completed_rounds,
                                                               final_counts=False), 6)}}
