"""One evaluation of each split for a round's report: the figures and the summed counts alike.

A round's report evaluates the validation and test splits twice when the plan sums metrics
through secure aggregation: once for the silo's own figures (accuracy, loss, ...), once for the
counts its next masked vector carries. Inside ``evaluations_shared()`` a trainer keeps what the
first evaluation computed (labels and outputs per split) and answers the second from it. Only
around evaluations of one model state: training inside forgets it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any


class SharedEvaluations:
    """A trainer's evaluations, each split's computed once inside ``evaluations_shared()``."""

    _memo: dict[str, Any] | None = None

    @contextmanager
    def evaluations_shared(self) -> Iterator[None]:
        """Within: each split is evaluated once for every figure and count asked of it."""
        self._memo = {}
        try:
            yield
        finally:
            self._memo = None

    def _remembered(self, key: str) -> Any:
        """What was kept under ``key`` inside the block (None outside it, or not yet kept)."""
        return None if self._memo is None else self._memo.get(key)

    def _remember(self, key: str, value: Any) -> None:
        """Keep ``value`` under ``key`` for the rest of the block (nothing outside it)."""
        if self._memo is not None:
            self._memo[key] = value

    def _forget_evaluations(self) -> None:
        """The model is about to change: nothing kept so far describes it any more."""
        if self._memo is not None:
            self._memo.clear()


def shared_evaluations(trainer: object) -> AbstractContextManager[None]:
    """``trainer.evaluations_shared()``, or nothing for a trainer without it (a stand-in)."""
    share = getattr(trainer, "evaluations_shared", None)
    return share() if share is not None else nullcontext()
