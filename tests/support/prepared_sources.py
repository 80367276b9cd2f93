"""Data sources for the tests of `silo data prepare`: one that refuses rows, and one that is
stopped half-way through writing its folder (by an interrupt, or by waiting to be killed).

A test names one as a reader ("tests.support.prepared_sources:read_refusing") in
trellis.silo.data.prepared.registry.READERS; the command then runs as it does for every format.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from trellis.silo.data.prepared.model import (
    Featuriser,
    Preparation,
    PreparedGraph,
    Refusal,
    SourceOptions,
)

FEATURISER = Featuriser("test-ring", "1", {})
# Set by the subprocess test: the file the stopping source creates once the write has begun.
STARTED_ENV = "TRELLIS_TEST_PREPARE_STARTED"


def ring(label: int, nodes: int = 4, origin: str = "rings.txt:1", key: str = "") -> PreparedGraph:
    """A ring of `nodes` nodes with one-hot degree-ish features, both edge directions listed."""
    src = np.arange(nodes)
    dst = (src + 1) % nodes
    edge_index = np.stack([np.concatenate([src, dst]), np.concatenate([dst, src])])
    x = np.eye(3, dtype=np.float32)[np.arange(nodes) % 3]
    return PreparedGraph(x=x, edge_index=edge_index.astype(np.int64), edge_attr=None,
                         label=label, origin=origin, key=key)


def rings(count: int, source: str = "rings.txt") -> list[PreparedGraph]:
    """`count` rings of growing size, labels alternating 0 and 1."""
    return [ring(i % 2, nodes=3 + i, origin=f"{source}:{i + 1}") for i in range(count)]


def read_refusing(source: Path, options: SourceOptions) -> Preparation:
    """Twelve graphs, and 25 rows refused (more than the command lists on stderr)."""
    refused = [Refusal(source.name, str(row), f"row {row} has no label")
               for row in range(13, 38)]
    return Preparation(graphs=rings(12, source.name), refused=refused, featuriser=FEATURISER,
                       sources=[source], name=options.name or source.stem)


class _Interrupted(list[PreparedGraph]):
    """Graphs whose listing is interrupted after the first few (Ctrl-C while writing)."""

    def __iter__(self) -> Iterator[PreparedGraph]:
        for index, graph in enumerate(list.__iter__(self)):
            if index == 3:
                raise KeyboardInterrupt
            yield graph


class _Stalled(list[PreparedGraph]):
    """Graphs whose listing stops after the first few until the process is killed."""

    def __iter__(self) -> Iterator[PreparedGraph]:
        for index, graph in enumerate(list.__iter__(self)):
            if index == 3:
                Path(os.environ[STARTED_ENV]).write_text("writing\n")
                time.sleep(120)
            yield graph


def read_interrupted(source: Path, options: SourceOptions) -> Preparation:
    """Ten graphs, interrupted (KeyboardInterrupt) while they are being written."""
    return Preparation(graphs=_Interrupted(rings(10, source.name)), refused=[],
                       featuriser=FEATURISER, sources=[source], name="interrupted")


def read_stalled(source: Path, options: SourceOptions) -> Preparation:
    """Ten graphs that stall while being written, for a test that stops the process."""
    return Preparation(graphs=_Stalled(rings(10, source.name)), refused=[],
                       featuriser=FEATURISER, sources=[source], name="stalled")
