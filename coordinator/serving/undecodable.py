"""Requests whose bytes do not parse as their message are refused with INVALID_ARGUMENT.

gRPC's own answer to a request it cannot deserialise is INTERNAL ("Exception deserializing
request!"), the code of a server bug. A silo that sends bytes no Trellis message can be (another
build, a corrupted agent, a hostile peer) is bad input instead: this interceptor parses with
the method's own deserialiser, and answers a failure with INVALID_ARGUMENT and what to check,
before any handler (or the wire capture) sees the request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError


class _Undecodable:
    """Stands in for a request that did not parse; the wrapped behaviour refuses it."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class RefuseUndecodable(grpc.aio.ServerInterceptor):
    """Answer unparsable request bytes with INVALID_ARGUMENT instead of gRPC's INTERNAL."""

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        parse = handler.request_deserializer

        def tolerant(data: bytes) -> Any:
            try:
                return parse(data)
            except DecodeError as exc:
                return _Undecodable(str(exc))

        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
            if isinstance(request, _Undecodable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"the {method} request is not a valid Trellis message "
                                    f"({request.reason}); check that the silo runs a Trellis "
                                    "agent of this coordinator's protocol version")

        async def checked(iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
                          ) -> AsyncIterator[Any]:
            async for request in iterator:
                await refuse(request, context)
                yield request
                del request

        ser = handler.response_serializer
        if handler.unary_unary is not None:
            unary = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await refuse(request, context)
                return await unary(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, request_deserializer=tolerant, response_serializer=ser)
        if handler.unary_stream is not None:
            streaming = handler.unary_stream

            async def unary_stream(request: Any, context: grpc.aio.ServicerContext
                                   ) -> AsyncIterator[Any]:
                await refuse(request, context)
                async for reply in streaming(request, context):
                    yield reply
                    del reply

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, request_deserializer=tolerant, response_serializer=ser)
        if handler.stream_unary is not None:
            collecting = handler.stream_unary

            async def stream_unary(iterator: AsyncIterator[Any],
                                   context: grpc.aio.ServicerContext) -> Any:
                return await collecting(checked(iterator, context), context)

            return grpc.stream_unary_rpc_method_handler(
                stream_unary, request_deserializer=tolerant, response_serializer=ser)
        both = handler.stream_stream

        async def stream_stream(iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
                                ) -> AsyncIterator[Any]:
            async for reply in both(checked(iterator, context), context):
                yield reply
                del reply

        return grpc.stream_stream_rpc_method_handler(
            stream_stream, request_deserializer=tolerant, response_serializer=ser)
