"""Federation-wide figures from evaluation counts summed inside the masked vectors
([metrics] aggregate = true; protos/metrics_plan.py).

A silo evaluates the state it loads when a round opens, which is the result of the round before,
so round t's masked vectors carry the counts of round t - 1: their sum becomes the figures of
round t - 1's record, under the key FEDERATION, where every reader of a round's metrics (early
stopping, the best-round report, status, results) finds one entry that is the whole federation.
The last round's counts ride one more attempt that trains nothing (the sequencer's evaluation
attempt). No silo's own figure ever reaches the coordinator: only sums over a round's survivors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from trellis.coordinator.rounds.stages.base import Event, RoundRecord
from trellis.protos.metrics_plan import FEDERATION, MetricsConfig, federation_figures


def attach_sums(history: Sequence[RoundRecord], evaluated_round: int,
                sums: Mapping[str, float] | None, metrics: MetricsConfig,
                survivors: Sequence[str]) -> list[Event]:
    """Record the federation-wide figures of `evaluated_round` from the survivors' summed
    counts; nothing for round 0 (the initial state is not a round) or an empty sum."""
    record = next((r for r in history if r.round == evaluated_round), None)
    if sums is None or record is None:
        return []
    figures = {k: round(v, 6) for k, v in federation_figures(sums, metrics).items()}
    if not figures:
        return []
    record.metrics[FEDERATION] = figures
    return [Event("metrics_summed", {"round": evaluated_round, "silos": len(survivors),
                                     **figures})]
