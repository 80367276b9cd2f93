"""HTTP/2 keepalive for both ends of the federation's gRPC connections.

Without it, a link that dies silently (a cable pulled, a NAT entry dropped, a host frozen)
leaves the silo waiting on its control stream forever and the coordinator holding a stream to
nobody. Each side pings an idle connection every interval and gives up when the answer is
late, so a dead link turns into an error the agent's reconnection (and the coordinator's
dropout handling) already deal with. TRELLIS_KEEPALIVE_S changes the interval (tests use a
few seconds; networks with aggressive NAT timeouts may want less than the default).
"""

from __future__ import annotations

import os

DEFAULT_INTERVAL_S = 30.0


def interval_s() -> float:
    """The ping interval: TRELLIS_KEEPALIVE_S, else 30 s."""
    try:
        value = float(os.environ.get("TRELLIS_KEEPALIVE_S", DEFAULT_INTERVAL_S))
    except ValueError:
        return DEFAULT_INTERVAL_S
    return value if value > 0 else DEFAULT_INTERVAL_S


def client_options() -> list[tuple[str, int]]:
    """Channel options for a silo: ping every interval, give up after one more."""
    ms = int(interval_s() * 1000)
    return [("grpc.keepalive_time_ms", ms), ("grpc.keepalive_timeout_ms", ms),
            ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)]


def server_options() -> list[tuple[str, int]]:
    """Server options: accept the silos' pings and ping idle silos the same way."""
    ms = int(interval_s() * 1000)
    return [("grpc.keepalive_time_ms", ms), ("grpc.keepalive_timeout_ms", ms),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", ms // 2),
            ("grpc.http2.max_ping_strikes", 0)]
