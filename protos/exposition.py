"""Serve one Prometheus registry over HTTP at host:port (`--metrics-listen` of both commands).

Each process exposes its own ``CollectorRegistry``, never prometheus_client's global one, so
nothing a library registers there (or a second federation in one test process) mixes in.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from trellis.protos.fields import valid_address


class EndpointError(ValueError):
    """A listen address that is malformed, or that this process cannot bind."""


@dataclass
class MetricsEndpoint:
    """A running /metrics HTTP server: its bound port, and how to stop it."""

    server: WSGIServer
    thread: Thread
    port: int

    def stop(self) -> None:
        """Stop answering scrapes."""
        self.server.shutdown()
        self.server.server_close()


def parse_listen(option: str, address: str) -> tuple[str, int]:
    """(host, port) of a host:port option value, or EndpointError naming the option."""
    if not valid_address(address):
        raise EndpointError(f"{option} {address!r}: expected host:port, e.g. 127.0.0.1:9464 "
                            "(0.0.0.0:9464 for every interface)")
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def serve_metrics(address: str, registry: CollectorRegistry,
                  option: str = "--metrics-listen") -> MetricsEndpoint:
    """Start answering GET /metrics at address with registry's metrics (a daemon thread)."""
    host, port = parse_listen(option, address)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except socket.gaierror as exc:
        raise EndpointError(f"{option} {address!r}: the host name does not resolve "
                            f"({exc.strerror})") from None
    except OSError as exc:
        raise EndpointError(f"{option} {address}: cannot listen there ({exc.strerror}); is "
                            "another process using the port? choose another with "
                            f"{option}") from None
    return MetricsEndpoint(server, thread, server.server_address[1])
