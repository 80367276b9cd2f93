"""Wire capture: every request message the coordinator receives, as bytes, for review.

A compliance reviewer (and our privacy test) can replay the capture to check that nothing but
masked vectors, signed public keys and chosen metrics ever arrived. The file is a sequence of
records: 2-byte method-name length, the name, 8-byte message length, the serialised message.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc


class WireCapture(grpc.ServerInterceptor):
    """A server interceptor that appends each received request message to a file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "ab")  # noqa: SIM115 -- lives as long as the server
        self._lock = threading.Lock()

    def record(self, method: str, message: Any) -> None:
        """Append one received message."""
        name = method.encode()
        body = message.SerializeToString()
        with self._lock:
            self._file.write(struct.pack(">H", len(name)) + name)
            self._file.write(struct.pack(">Q", len(body)) + body)
            self._file.flush()

    def close(self) -> None:
        """Close the capture file."""
        with self._lock:
            self._file.close()

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        ser, des = handler.response_serializer, handler.request_deserializer
        if handler.request_streaming:
            inner = handler.stream_unary or handler.stream_stream

            def tapped(iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
                return inner(self._tap(method, iterator), context)

            factory = (grpc.stream_unary_rpc_method_handler if handler.stream_unary
                       else grpc.stream_stream_rpc_method_handler)
            return factory(tapped, request_deserializer=des, response_serializer=ser)
        inner = handler.unary_unary or handler.unary_stream

        def recorded(request: Any, context: grpc.ServicerContext) -> Any:
            self.record(method, request)
            return inner(request, context)

        factory = (grpc.unary_unary_rpc_method_handler if handler.unary_unary
                   else grpc.unary_stream_rpc_method_handler)
        return factory(recorded, request_deserializer=des, response_serializer=ser)

    def _tap(self, method: str, iterator: Iterator[Any]) -> Iterator[Any]:
        for message in iterator:
            self.record(method, message)
            yield message


def read_capture(path: Path) -> Iterator[tuple[str, bytes]]:
    """(method, serialised message) for every record of a capture file."""
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
        (name_len,) = struct.unpack_from(">H", data, offset)
        offset += 2
        method = data[offset:offset + name_len].decode()
        offset += name_len
        (body_len,) = struct.unpack_from(">Q", data, offset)
        offset += 8
        yield method, data[offset:offset + body_len]
        offset += body_len
