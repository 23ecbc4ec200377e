"""Undecodable requests get INVALID_ARGUMENT with a one-line reason, not gRPC's UNKNOWN.

gRPC answers a request its deserializer cannot parse with status UNKNOWN ("Unexpected
<class DecodeError>"). :class:`MalformedRequestGuard` is a server interceptor that wraps every
method's deserializer: a parse failure becomes a :class:`Malformed` marker, and the method
aborts with INVALID_ARGUMENT before the servicer (and the cloud's state) sees anything.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc


#: methods of the standard health service, left as grpcio-health-checking serves them
HEALTH_PREFIX = "/grpc.health.v1.Health/"


class Malformed:
    """A request that could not be parsed (``reason``: one line)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _tolerant(deserializer: Callable[[bytes], Any] | None, method: str) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        if deserializer is None:
            return data
        try:
            return deserializer(data)
        except Exception as err:  # noqa: BLE001 - any parse failure is the caller's fault
            text = str(err).splitlines()[0] if str(err) else type(err).__name__
            text = text if len(text) <= 160 else text[:160] + "…"  # never echo much
            return Malformed(f"{method}: malformed request ({len(data)} bytes): {text}")

    return parse


def _unary(behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        return await behavior(request, context)

    return run


def _stream(behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        async for item in behavior(request, context):
            yield item

    return run


class MalformedRequestGuard(grpc.aio.ServerInterceptor):
    """Turn undecodable unary requests into INVALID_ARGUMENT (see the module docstring)."""

    async def intercept_service(self, continuation: Callable[..., Awaitable[Any]],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        """Wrap unary handlers so a malformed request is refused with one short status."""
        handler = await continuation(handler_call_details)
        if (handler is None or handler.request_streaming
                or handler_call_details.method.startswith(HEALTH_PREFIX)):
            # grpc.health.v1's Watch writes through its context instead of yielding
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        parse = _tolerant(handler.request_deserializer, method)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _unary(handler.unary_unary), request_deserializer=parse,
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _stream(handler.unary_stream), request_deserializer=parse,
                response_serializer=handler.response_serializer)
        return handler


__all__ = ["Malformed", "MalformedRequestGuard"]
