"""The silo's own figures per round, ``<state-dir>/metrics.jsonl``: kept home, never sent.

One JSON object per completed round: the round, when it was written (UTC), the seconds local
training took, and every figure the silo computed for itself (validation and test accuracy and
loss, training loss), whatever ``--report`` lets the coordinator see. The file is rewritten
whole through a temporary file (protos/files.py), so a crash leaves the old file or the new one,
never half a line; a round already in the file (sent again after a reconnect, or by a restarted
silo) is not written twice.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trellis.protos.files import write_atomic

METRICS_FILE = "metrics.jsonl"


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics file in file order (empty when there is none yet)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} line {number} is not JSON ({exc.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("round"), int):
            raise ValueError(f"{path} line {number} has no round number")
        records.append(record)
    return records


class MetricsFile:
    """Appends one line per completed round to the silo's metrics file, each round once."""

    def __init__(self, path: Path, *, now: Callable[[], datetime] = lambda: datetime.now(UTC)
                 ) -> None:
        self.path = path
        self._now = now
        self._lines = [json.dumps(r, sort_keys=True) for r in read_metrics(path)]
        self._rounds = {json.loads(line)["round"] for line in self._lines}

    @property
    def rounds(self) -> set[int]:
        """The rounds already in the file."""
        return set(self._rounds)

    def record(self, round_no: int, metrics: Mapping[str, float],
               train_seconds: float | None) -> bool:
        """Add the round's line unless the file has it; True when written."""
        if round_no in self._rounds:
            return False
        record: dict[str, Any] = {
            "round": round_no,
            "time": self._now().isoformat(timespec="seconds"),
            # NaN (an empty split) is not JSON: null instead.
            **{k: (None if math.isnan(v) else v) for k, v in sorted(metrics.items())},
        }
        if train_seconds is not None:
            record["train_seconds"] = round(train_seconds, 3)
        lines = [*self._lines, json.dumps(record, sort_keys=True)]
        text = "".join(line + "\n" for line in lines).encode()
        write_atomic(self.path, lambda handle: handle.write(text))
        self._lines = lines
        self._rounds.add(round_no)
        return True
