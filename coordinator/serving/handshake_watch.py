"""Failed TLS handshakes, which gRPC Python reports to no handler, read from gRPC's own log.

A client with no certificate, or one from another CA, fails the handshake inside gRPC's C core:
no servicer, interceptor or credentials callback of gRPC Python hears of it (the server's
verification runs in C and has no Python hook). The C core logs each failure to the process's
standard error ("Handshake failed with error SSL_ERROR_SSL: ..."), so `coordinator serve` routes
its fd 2 through a thread that turns those lines into refusals (reason `tls_handshake`: counted
in metrics, audited and logged as one line, at most `BURST` then one per `REFILL_S` seconds) and
keeps gRPC's other informational lines out of the operator's output. Every other line passes
unchanged. It sees what gRPC logs: with GRPC_VERBOSITY=ERROR (or NONE) set by the operator, the
C core says nothing of a failed handshake and none is recorded.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
import threading
from collections.abc import Callable

from trellis.coordinator.serving.attend_rate import AttendRate
from trellis.coordinator.serving.core import CoordinatorCore
from trellis.coordinator.serving.metrics import TLS_HANDSHAKE_REASON, CoordinatorMetrics

# The C core's log prefix (absl): severity, date, time, thread id, source file and line.
_CORE_LINE = re.compile(rb"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ (\S+):\d+\] ?(.*)$")
_HANDSHAKE = re.compile(rb"Handshake failed with (?:fatal )?error (\S+?):? (.*)$")
HANDSHAKE_SUBJECT = "a client that failed the TLS handshake"
# What the C core's words mean for the operator (OpenSSL's and gRPC's texts).
_MEANINGS = {
    "unable to get local issuer certificate": "a client certificate from another CA",
    "Invalid certificate verification context": "no client certificate",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "no client certificate",
    "certificate has expired": "an expired client certificate",
    "WRONG_VERSION_NUMBER": "not TLS",
}


def read_core_line(line: bytes) -> tuple[str, str] | None:
    """('handshake', why) for a failed handshake, ('drop', '') for another informational C-core
    line, None for anything else (passed through: Python's own lines, gRPC's errors)."""
    found = _CORE_LINE.match(line.rstrip(b"\r\n"))
    if found is None:
        return None
    severity, _, message = found.groups()
    failed = _HANDSHAKE.search(message)
    if failed is not None:
        detail = failed.group(2).decode(errors="replace")
        # "error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: unable to
        # get local issuer certificate": the words after the last OpenSSL field say why.
        why = detail.rsplit(":", 1)[-1].strip() or detail
        return "handshake", next((f"{meaning}: {why}" for said, meaning in _MEANINGS.items()
                                  if said in detail), why)
    return ("drop", "") if severity in (b"I", b"W") else None


class CoreLogRoute:
    """This process's fd 2 through a pipe: C-core lines read, everything else written on."""

    def __init__(self) -> None:
        self._listener: Callable[[str], None] | None = None
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self._saved = os.dup(2)
        read_end, write_end = os.pipe()
        sys.stderr.flush()
        os.dup2(write_end, 2)
        os.close(write_end)
        self._thread = threading.Thread(target=self._pump, args=(read_end,),
                                        name="grpc-log", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def listen(self, listener: Callable[[str], None]) -> None:
        """Hand each failed handshake's reason to listener (those seen before it, too)."""
        with self._lock:
            self._listener, pending, self._pending = listener, self._pending, []
        for why in pending:
            listener(why)

    def close(self, wait_s: float = 2.0) -> None:
        """Give fd 2 back and write out what is still in the pipe."""
        if self._saved < 0:
            return
        sys.stderr.flush()
        os.dup2(self._saved, 2)    # the pipe's last writer gone: the pump reads to its end
        self._thread.join(wait_s)  # a child process may still hold the pipe: not forever
        os.close(self._saved)
        self._saved = -1

    def _pump(self, read_end: int) -> None:
        out, rest = self._saved, b""
        while chunk := os.read(read_end, 65536):
            *lines, rest = (rest + chunk).split(b"\n")
            for line in lines:
                self._line(out, line + b"\n")
        if rest:
            self._line(out, rest)
        os.close(read_end)

    def _line(self, out: int, line: bytes) -> None:
        found = read_core_line(line)
        if found is None:
            os.write(out, line)
            return
        kind, why = found
        if kind != "handshake":
            return
        with self._lock:
            listener = self._listener
            if listener is None:
                self._pending.append(why)
        if listener is not None:
            try:
                listener(why)
            except Exception as exc:  # noqa: BLE001 -- never lose the log over a count
                os.write(out, f"warning: cannot record a failed TLS handshake ({exc})\n"
                         .encode())


def handshake_refusals(core: CoordinatorCore, metrics: CoordinatorMetrics | None
                       ) -> Callable[[str], None]:
    """Record one failed handshake: every one in metrics; audit record and log line coalesced
    like re-attends (a flood of bad handshakes writes a bounded number of records)."""
    rate = AttendRate(core.clock)

    def refused(why: str) -> None:
        if metrics is not None:
            metrics.count_refusal("tls_handshake")
        if rate.admit("tls").admitted:
            core.refused(HANDSHAKE_SUBJECT, f"{TLS_HANDSHAKE_REASON} ({why})")

    return refused
