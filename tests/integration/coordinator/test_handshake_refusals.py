"""Failed TLS handshakes at a real `coordinator serve` process: recorded, and gRPC's C-core line
kept out of the operator's output."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from tests.support.federation import (
    free_port,
    make_workspace,
    port_of,
    start_coordinator,
    write_plan,
)
from trellis.coordinator.serving.handshake_watch import read_core_line
from trellis.crypto.pki import init_ca, load_identity, request_identity, sign_request
from trellis.protos import codec
from trellis.protos import federation_pb2_grpc as pb_grpc
from trellis.protos.messages import PROTOCOL_VERSION, Envelope, Phase

T = TypeVar("T")


def _eventually(probe: Callable[[], T | None], what: str, limit_s: float = 90) -> T:
    """Poll probe until it returns something (a bound against hanging, not a timing check)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        found = probe()
        if found is not None:
            return found
        time.sleep(0.2)
    raise AssertionError(f"never saw {what}")


def _refusals(audit: Path) -> list[dict] | None:
    if not audit.exists():
        return None
    records = [json.loads(line) for line in audit.read_text().splitlines() if line]
    return [r for r in records if r["event"] == "refused"]


def test_a_foreign_or_missing_certificate_is_recorded_and_grpcs_log_line_is_kept_out(
        tmp_path: Path) -> None:
    """Before, the coordinator recorded no refusal for a failed handshake (no audit record, no
    metric, no log line of its own) and the operator saw gRPC's C-core line instead."""
    ws = make_workspace(tmp_path, graphs=20)
    init_ca(tmp_path / "other-ca", ["localhost"])
    sign_request(request_identity("hospital-a", tmp_path / "foreign"), tmp_path / "other-ca")
    plan = write_plan(ws, "tls", algorithm="fedavg", min_silos=2)
    log = tmp_path / "coordinator.log"
    metrics_port = free_port()
    coordinator = start_coordinator(plan, log, extra=["--metrics-listen",
                                                      f"127.0.0.1:{metrics_port}"])
    try:
        _eventually(lambda: "listening on port" in log.read_text() or None, "the coordinator up")
        foreign = load_identity(tmp_path / "foreign")
        ca_pem = (ws.ca / "ca.crt").read_bytes()
        for credentials in (grpc.ssl_channel_credentials(
                                root_certificates=ca_pem, private_key=foreign.key_pem,
                                certificate_chain=foreign.cert_pem),
                            grpc.ssl_channel_credentials(root_certificates=ca_pem)):
            with grpc.secure_channel(f"127.0.0.1:{port_of(plan)}", credentials) as channel:
                stream = pb_grpc.FederationStub(channel).Attend(
                    codec.attend_request(Envelope("", 0, 0, Phase.JOIN), PROTOCOL_VERSION),
                    timeout=10)
                with pytest.raises(grpc.RpcError) as info:
                    next(stream)
                assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        audit = ws.root / "tls" / "coordinator" / "audit.jsonl"
        refused = _eventually(lambda: (found := _refusals(audit)) and len(found) >= 2 and found
                              or None, "two refusals in the audit log")
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                         timeout=10).read().decode()
    finally:
        coordinator.send_signal(signal.SIGINT)
        coordinator.wait(60)
    assert [(r["subject"], r["reason"].split(" (")[0]) for r in refused] == [
        ("a client that failed the TLS handshake", "TLS handshake failed")] * 2
    assert 'trellis_coordinator_refusals_total{reason="tls_handshake"} 2.0' in metrics
    text = log.read_text()
    assert "ssl_transport_security" not in text and "Handshake failed with" not in text, text
    lines = [line for line in text.splitlines() if "failed the TLS handshake" in line]
    assert len(lines) == 2, text
    assert lines[0].endswith("TLS handshake failed (a client certificate from another CA: "
                             "unable to get local issuer certificate)"), lines
    assert "TLS handshake failed (no client certificate" in lines[1], lines


def test_grpc_core_lines_are_read_and_python_lines_pass() -> None:
    line = (b"I1127 09:29:13.074902   16949 ssl_transport_security.cc:2563] Handshake failed "
            b"with error SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
            b"CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate\n")
    assert read_core_line(line) == ("handshake", "a client certificate from another CA: "
                                                 "unable to get local issuer certificate")
    assert read_core_line(b"W1127 09:29:13.074902 1 chttp2_server.cc:1] something\n") == (
        "drop", "")
    assert read_core_line(b"E1127 09:29:13.074902 1 server.cc:1] a real error\n") is None
    assert read_core_line(b"2026-11-27T09:29:13Z WARNING coordinator refused x\n") is None
