"""A silo's side of [metrics] aggregate = true: its counts ride its masked vector, never a report.

When a round opens the silo evaluates the state it loaded (the previous round's result) as it
always does, keeps every figure at home (its metrics file), and keeps the COUNTS of that
evaluation (silo/federation/evaluation_counts.py) for this round's masked vector, in the slots
every silo and the coordinator agree on (protos/metrics_plan.py). Round 1 has no previous round:
its slots are zeros. The attempt after the last round (announced with total_rounds below its
round) trains nothing: the silo sends zeros for the model and the final state's counts.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from trellis.crypto.dp_encoding import to_ring
from trellis.crypto.randomness import RandomSource
from trellis.protos.counts_privacy import counts_share_sigma
from trellis.protos.metrics_plan import encode_counts, metric_slots
from trellis.protos.plan import PublicPlan
from trellis.silo.federation.evaluation_counts import SplitOutputs, evaluation_counts
from trellis.silo.privacy.private_step import add_noise


class Classifier(Protocol):
    """What a silo's trainer tells about its task."""

    @property
    def num_classes(self) -> int:
        """The classes of the silo's data."""


class SummedMetrics:
    """The counts this silo will append to its next masked vector."""

    def __init__(self, plan: PublicPlan) -> None:
        self.config = plan.metrics
        self.slots = len(metric_slots(plan.metrics))
        self.max_count = plan.aggregation.max_sample_count
        self.ring_bits = plan.aggregation.ring_bits
        self.share_sigma = counts_share_sigma(plan)    # 0 without privacy
        self._kept: tuple[int, np.ndarray] | None = None     # (round evaluated, integers)

    @classmethod
    def for_plan(cls, plan: PublicPlan, silo: str, trainer: Classifier) -> SummedMetrics | None:
        """This silo's summed metrics if the plan sums them (None: it reports its figures);
        ValueError, before anything is sent, if its classes do not fit the plan's slots."""
        if not plan.metrics.aggregate:
            return None
        summed = cls(plan)
        if problem := summed.class_problem(silo, trainer.num_classes):
            raise ValueError(problem)
        return summed

    def class_problem(self, silo: str, num_classes: int) -> str:
        """Why this silo's classes do not fit the plan's per-class slots ("" if they do)."""
        classes = self.config.classes
        if not classes or num_classes <= classes:
            return ""
        return (f"the plan sums per-class counts for {classes} classes (metrics.classes); "
                f"silo {silo!r} has {num_classes} classes in its data, so it refuses the plan "
                "(nothing was sent); ask the coordinator operator to raise metrics.classes")

    def keep(self, round_evaluated: int, outputs_of: SplitOutputs) -> dict[str, float]:
        """Count the evaluation of `round_evaluated`'s state, for the next masked vector; the
        counts, for the silo's own metrics file."""
        counts = evaluation_counts(outputs_of, self.config)
        largest = max((v for k, v in counts.items() if not k.endswith("_loss_sum")), default=0)
        if largest > self.max_count:
            raise ValueError(f"a split of this silo holds {largest:g} examples, more than the "
                             f"plan's aggregation.max_sample_count {self.max_count}")
        self._kept = (round_evaluated, encode_counts(counts, self.config))
        return counts

    def after(self, vector: np.ndarray, round_no: int, source: RandomSource) -> np.ndarray:
        """A masked vector's ring elements with round `round_no`'s slots appended (with this
        silo's noise share when private, drawn from its private `source`)."""
        counts = add_noise(self.integers(round_no), self.share_sigma, source)
        return np.concatenate([vector, to_ring(counts, self.ring_bits)])

    def integers(self, round_no: int) -> np.ndarray:
        """The slots of round `round_no`'s masked vector: the counts of round_no - 1, or zeros
        when this silo holds none (round 1, or a process restarted since)."""
        if self._kept is not None and self._kept[0] == round_no - 1:
            return self._kept[1].copy()
        return np.zeros(self.slots, np.int64)
