"""The largest sizes a plan may ask for (docs/configuration.md, "Sizes").

A plan is written by one party and trained by every silo: without a ceiling, `hidden = 100000000`
or `rounds = 10**20` would be accepted and fail, or run for ever, only on the silos' machines.
Each maximum is far above what the papers use (hidden 64, 3 layers, 200 rounds, batch 128), so
a real plan never meets one; a silo that wants a tighter bound on the model it trains sets its
policy's `max_hidden` and `max_layers` (silo/privacy/policy.py).
"""

from __future__ import annotations

LIMITS: dict[str, int] = {
    "federation.rounds": 100_000,
    "model.hidden": 4096,
    "model.layers": 64,
    "model.width": 4096,
    "model.n_rw": 1024,
    "model.n_dg": 1024,
    "training.batch_size": 1 << 20,
    "training.local_epochs": 10_000,
    "fedhgn.classes": 100_000,
    "fedhgn.hidden": 4096,
    "fedhgn.bases": 1024,
    "fedhgn.local_epochs": 10_000,
    "fedhgn.patience": 100_000,
    "fedhgn.max_epochs": 1_000_000,
    "clustering.seq_length": 100_000,
}


def limit(path: str) -> int:
    """The largest value the plan field at `path` (e.g. "model.hidden") may take."""
    return LIMITS[path]
