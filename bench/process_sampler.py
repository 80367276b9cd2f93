"""A process's peak resident memory, resident memory over time, threads and CPU seconds, read
from /proc every 0.1 s until the process exits (the benchmarks that start real processes)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


class ProcessSampler:
    """Readings of one process, taken on a thread of their own from the moment it is made."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_bytes = 0                                # VmHWM: the kernel's own peak
        self.cpu_s = 0.0
        self.timeline: list[tuple[float, int]] = []      # (wall clock, resident bytes)
        self.threads = 0                                   # the most threads seen at once
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        ticks = os.sysconf("SC_CLK_TCK")
        while True:
            try:
                status = Path(f"/proc/{self.pid}/status").read_text()
                stat = Path(f"/proc/{self.pid}/stat").read_text()
            except OSError:
                return
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_bytes = max(self.peak_bytes, int(line.split()[1]) * 1024)
                elif line.startswith("VmRSS:"):
                    self.timeline.append((time.time(), int(line.split()[1]) * 1024))
                elif line.startswith("Threads:"):
                    self.threads = max(self.threads, int(line.split()[1]))
            fields = stat.rsplit(")", 1)[1].split()
            self.cpu_s = (int(fields[11]) + int(fields[12])) / ticks
            time.sleep(0.1)

    def join(self) -> None:
        """Wait for the process's last reading."""
        self._thread.join()
