"""The operating-system source reads ahead: its bytes must never be served twice, in one
process or across a fork; and its narrow draws must stay uniform."""

from __future__ import annotations

import os

import numpy as np
import pytest
from scipy import stats

from trellis.crypto.randomness import OsRandomSource


def test_read_ahead_bytes_are_served_once() -> None:
    source = OsRandomSource()
    chunks = [source.random_bytes(32) for _ in range(3000)]      # crosses block boundaries
    assert len(set(chunks)) == len(chunks)
    assert len(source.random_bytes(OsRandomSource.BLOCK + 1)) == OsRandomSource.BLOCK + 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_reuse_the_parents_block() -> None:
    source = OsRandomSource()
    source.random_bytes(16)                     # the block is read; most of it still unserved
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                # the child: its next bytes, to the parent
        os.write(write, source.random_bytes(32))
        os._exit(0)
    os.close(write)
    child = os.read(read, 32)
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 32 and child != source.random_bytes(32)


@pytest.mark.parametrize("bound", [2, 3, 200, 70_000, 2**40 + 7])
def test_uniform_below_is_uniform_for_narrow_and_wide_bounds(bound: int) -> None:
    source = OsRandomSource()
    draws = source.uniform_below(np.full(60_000, bound))
    assert draws.min() >= 0 and draws.max() < bound
    # Twenty equal-probability bins (exact when bound is small: one bin per value).
    bins = min(bound, 20)
    counts = np.bincount(draws * bins // bound, minlength=bins)
    expected = np.array([len(range(-(-k * bound // bins), -(-(k + 1) * bound // bins)))
                         for k in range(bins)]) / bound * draws.size
    assert stats.chisquare(counts, expected).pvalue > 1e-6
    mixed = source.uniform_below(np.array([bound, 5] * 1000))
    assert (mixed[1::2] < 5).all() and (mixed[::2] < bound).all()
