"""Progress of long local work (loading, structure encoding, a local epoch) on a terminal.

Drawn by rich only when stderr is a terminal; under a service manager, a container or a log
shipper nothing is drawn and the loop runs unchanged. TRELLIS_PROGRESS=0 turns it off.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def wanted() -> bool:
    """Whether bars are drawn: stderr is a terminal and nobody turned them off."""
    return sys.stderr.isatty() and os.environ.get("TRELLIS_PROGRESS", "1") != "0"


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterable[T]:
    """items, with a transient progress bar on a terminal; items themselves otherwise."""
    if not wanted():
        return items
    from rich.console import Console
    from rich.progress import track as rich_track

    return rich_track(items, description=description, total=total, transient=True,
                      console=Console(stderr=True))


@contextlib.contextmanager
def status(description: str) -> Iterator[None]:
    """A spinner with description while the block runs, on a terminal only."""
    if not wanted():
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(description):
        yield
