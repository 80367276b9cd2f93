"""Progress bars are drawn on a terminal and nowhere else."""

from __future__ import annotations

import os
import select
import subprocess
import sys

SNIPPET = ("from trellis.silo.progress_bar import track\n"
           "import time\n"
           "for _ in track(range(5), 'structure encoding', total=5):\n"
           "    time.sleep(0.05)\n")


def _run(stderr_tty: bool, **env: str) -> bytes:
    if not stderr_tty:
        done = subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True,
                              env={**os.environ, **env}, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stderr
    master, slave = os.openpty()
    process = subprocess.Popen([sys.executable, "-c", SNIPPET], stderr=slave,
                               env={**os.environ, **env})
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(master, 4096)
        except OSError:          # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert process.wait(timeout=30) == 0
    return out


def test_a_bar_is_drawn_on_a_terminal() -> None:
    assert b"structure encoding" in _run(stderr_tty=True)


def test_nothing_is_drawn_when_stderr_is_not_a_terminal_or_bars_are_off() -> None:
    assert _run(stderr_tty=False) == b""
    assert b"structure encoding" not in _run(stderr_tty=True, TRELLIS_PROGRESS="0")
