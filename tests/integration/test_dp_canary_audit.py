"""The one-run canary audit (bench/dp_canary_audit.py), small: through the silo's encoding and
noise shares, the empirical epsilon stays at or below the accountant's, and rises without noise
(the positive control, which shows the audit can detect a leak)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_empirical_epsilon_is_bounded_by_the_accountant_and_rises_without_noise(
        tmp_path: Path) -> None:
    out = tmp_path / "audit.json"
    subprocess.run([sys.executable, str(ROOT / "bench" / "dp_canary_audit.py"), "--canaries",
                    "400", "--dimension", "4000", "--guesses", "100", "--multipliers", "0", "1",
                    "2", "--out", str(out)], check=True, capture_output=True, timeout=300)
    rows = {row["noise_multiplier"]: row for row in json.loads(out.read_text())["rows"]}
    for z in (1.0, 2.0):
        assert rows[z]["empirical_epsilon"] <= float(rows[z]["accountant_epsilon"])
    assert rows[0.0]["correct"] == rows[0.0]["guesses"]          # no noise: every guess right
    assert rows[0.0]["empirical_epsilon"] > rows[1.0]["empirical_epsilon"] > 0
    assert rows[1.0]["empirical_epsilon"] > rows[2.0]["empirical_epsilon"]
