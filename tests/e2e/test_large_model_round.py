"""A model of 64 MiB of shared parameters through real rounds, with a dropout, exactly summed.

The load harness (bench/secagg_scale.py) at its smallest: a real coordinator process and three
protocol-only silos (the `silo join` agent with a synthetic 16 Mi-value float32 vector instead
of a model) over mTLS. Each masked input (128 MiB in the 64-bit ring) is far above gRPC's 8 MiB
message limit, so it travels in chunks; the coordinator's upload budget (64 MiB here) admits one
at a time, so the others wait in flow control. One silo leaves after sending its key shares in
round 1; round 2 sends the 64 MiB global state back down to the survivors. The harness checks
the coordinator's final state bit for bit against the fixed-point mean of the survivors'
vectors; this test also runs the harness itself, so the benchmark cannot rot.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

pytestmark = pytest.mark.slow
MIB = 1 << 20
LENGTH = 16 * MIB            # float32 values: 64 MiB of shared parameters


def test_a_64_mib_model_survives_a_dropout_and_is_summed_exactly(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "secagg_scale.py"), "--silos", "3",
         "--length", str(LENGTH), "--protocols", "bonawitz", "--rounds", "2",
         "--drop", "0.34", "--upload-memory-mb", "64", "--per-process", "3",
         "--out", str(out)],
        capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["exact"] and row["dropped_as_planned"] and row["dropped"] == 1
    assert row["length"] * 4 == 64 * MIB
    # Each survivor masked and sent the whole vector (8-byte ring values) in both rounds,
    # and received the 64 MiB global state.
    assert row["silo_bytes"]["sent"] >= 2 * LENGTH * 8
    assert row["silo_bytes"]["received"] >= LENGTH * 4
