"""Wire capture: every request message the coordinator receives, as bytes, for review.

A compliance reviewer (and our privacy test) can replay the capture to check that nothing but
masked vectors, signed public keys and chosen metrics ever arrived. The file is a sequence of
records: 2-byte method-name length, the name, 8-byte message length, the serialised message.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from trellis.crypto.durable import open_append_private


class WireCapture(grpc.aio.ServerInterceptor):
    """A server interceptor (asyncio) that appends each received request message to a file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open_append_private(path)    # lives as long as the server
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

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        ser, des = handler.response_serializer, handler.request_deserializer
        if handler.request_streaming:
            if handler.stream_unary:
                collect = handler.stream_unary

                async def tapped_unary(iterator: AsyncIterator[Any],
                                       context: grpc.aio.ServicerContext) -> Any:
                    return await collect(self._tap(method, iterator), context)

                return grpc.stream_unary_rpc_method_handler(
                    tapped_unary, request_deserializer=des, response_serializer=ser)
            both = handler.stream_stream

            async def tapped_stream(iterator: AsyncIterator[Any],
                                    context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                async for reply in both(self._tap(method, iterator), context):
                    yield reply
                    del reply

            return grpc.stream_stream_rpc_method_handler(
                tapped_stream, request_deserializer=des, response_serializer=ser)
        if handler.unary_unary:
            single = handler.unary_unary

            async def recorded_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                self.record(method, request)
                return await single(request, context)

            return grpc.unary_unary_rpc_method_handler(
                recorded_unary, request_deserializer=des, response_serializer=ser)
        streaming = handler.unary_stream

        async def recorded_stream(request: Any, context: grpc.aio.ServicerContext
                                  ) -> AsyncIterator[Any]:
            self.record(method, request)
            async for reply in streaming(request, context):
                yield reply
                del reply

        return grpc.unary_stream_rpc_method_handler(
            recorded_stream, request_deserializer=des, response_serializer=ser)

    async def _tap(self, method: str, iterator: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for message in iterator:
            self.record(method, message)
            yield message
            del message


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
