"""status.json and results.json while the federation runs, written off the rounds' path.

The server's deadline thread calls ``refresh`` after every wake-up; a snapshot is taken under
the core's lock (no I/O there) and written outside it, at most every ``MIN_INTERVAL_S`` unless
a round completed, so handlers never wait for a disk. ``finish`` writes the final results and
status and stops any later refresh from overwriting them with a "running" document.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trellis.coordinator.operations.status import STATUS_FILE
from trellis.coordinator.serving.core import CoordinatorCore
from trellis.coordinator.state.checkpoint import RESULTS
from trellis.coordinator.state.results import build_results
from trellis.protos.files import write_atomic, write_json_atomic

MIN_INTERVAL_S = 0.5


class LiveFiles:
    """Keeps state_dir/status.json and state_dir/results.json current while a server runs."""

    def __init__(self, core: CoordinatorCore, *, wall: Callable[[], float] = time.time) -> None:
        self.core = core
        self.wall = wall
        self.state_dir: Path = core.plan.server.state_dir
        self._write_lock = threading.Lock()
        self._finished = False
        self._last_write = -float("inf")
        self._status_key: Any = None
        self._results_key: Any = None

    def refresh(self) -> None:
        """Write what changed since the last call (throttled; a completed round at once)."""
        core = self.core
        with core.locked():
            status = core.status()
            history = core.machine.history
            results_key = (len(history), sum(len(r.metrics) for r in history))
            results_text = None
            if results_key != self._results_key:
                results_text = _dump(build_results(
                    core.plan, history, mode="federation", status="running",
                    elapsed_s=core.clock() - core.started, strategy=core.machine.strategy))
        status_key = (status.round, status.rounds_completed, status.stage, status.connected,
                      status.dropped, status.refused, status.metrics_round, status.reported,
                      status.failure)
        round_done = (self._results_key is not None
                      and results_key[0] != self._results_key[0])
        if status_key == self._status_key and results_text is None:
            return
        now = time.monotonic()
        if not round_done and now - self._last_write < MIN_INTERVAL_S:
            return                # the next wake-up writes it
        with self._write_lock:
            if self._finished:
                return
            if results_text is not None:
                _write_text(self.state_dir / RESULTS, results_text)
                self._results_key = results_key
            _write_text(self.state_dir / STATUS_FILE, _dump(status.to_json()))
            self._status_key = status_key
            self._last_write = now

    def finish(self, results: dict[str, Any]) -> None:
        """Write the final results and status; nothing running is written after them."""
        with self._write_lock:
            self._finished = True
            write_json_atomic(self.state_dir / RESULTS, results)
            with self.core.locked():
                status = self.core.status()
            _write_text(self.state_dir / STATUS_FILE, _dump(status.to_json()))


def _dump(document: Any) -> str:
    # Serialised under the core's lock: the round records' metrics change as silos report.
    return json.dumps(document, indent=2, sort_keys=True, allow_nan=True)


def _write_text(path: Path, text: str) -> None:
    try:
        write_atomic(path, lambda handle: handle.write(text.encode()))
    except OSError as exc:
        # Watching is a convenience: a full disk must not stop the federation.
        print(f"warning: {path.name} not written: {exc}", file=sys.stderr, flush=True)
