"""The torch thread limit of the commands that train or predict (`join`, `predict`)."""

from __future__ import annotations

import os

import typer


def configure_threads(threads: int | None) -> None:
    """Limit torch/OpenMP threads; must run before torch is imported to take full effect.

    Several processes sharing the cores with spin-waiting OpenMP threads slow rounds down by
    an order of magnitude, so a limited silo also waits passively.
    """
    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import torch
    except ImportError as exc:
        typer.echo(f"error: a silo trains with torch, which is not installed ({exc}); install "
                   "the silo extra: pip install 'trellis-fgl[silo]'", err=True)
        raise typer.Exit(2) from None

    if threads:
        torch.set_num_threads(threads)
