"""Requests whose bytes do not parse as their message are refused with INVALID_ARGUMENT.

gRPC's own answer to a request it cannot deserialise is INTERNAL ("Exception deserializing
request!"), the code of a server bug. A silo that sends bytes no Trellis message can be (another
build, a corrupted agent, a hostile peer) is bad input instead: this interceptor parses with
the method's own deserialiser, and answers a failure with INVALID_ARGUMENT and what to check,
before any handler (or the wire capture) sees the request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError


class _Undecodable:
    """Stands in for a request that did not parse; the wrapped behaviour refuses it."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class RefuseUndecodable(grpc.ServerInterceptor):
    """Answer unparsable request bytes with INVALID_ARGUMENT instead of gRPC's INTERNAL."""

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        parse = handler.request_deserializer

        def tolerant(data: bytes) -> Any:
            try:
                return parse(data)
            except DecodeError as exc:
                return _Undecodable(str(exc))

        def refuse(request: Any, context: grpc.ServicerContext) -> None:
            if isinstance(request, _Undecodable):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"the {method} request is not a valid Trellis message "
                              f"({request.reason}); check that the silo runs a Trellis agent "
                              "of this coordinator's protocol version")

        def checked(iterator: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            for request in iterator:
                refuse(request, context)
                yield request

        ser = handler.response_serializer
        if handler.unary_unary is not None:
            unary = handler.unary_unary

            def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
                refuse(request, context)
                return unary(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, request_deserializer=tolerant, response_serializer=ser)
        if handler.unary_stream is not None:
            streaming = handler.unary_stream

            def unary_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                refuse(request, context)
                yield from streaming(request, context)

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, request_deserializer=tolerant, response_serializer=ser)
        if handler.stream_unary is not None:
            collecting = handler.stream_unary

            def stream_unary(iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
                return collecting(checked(iterator, context), context)

            return grpc.stream_unary_rpc_method_handler(
                stream_unary, request_deserializer=tolerant, response_serializer=ser)
        both = handler.stream_stream

        def stream_stream(iterator: Iterator[Any], context: grpc.ServicerContext
                          ) -> Iterator[Any]:
            yield from both(checked(iterator, context), context)

        return grpc.stream_stream_rpc_method_handler(
            stream_stream, request_deserializer=tolerant, response_serializer=ser)
