"""Guards the calls that anyone may make (the anonymous enrollment identity is public).

A gRPC server interceptor, for ``Enroll`` and the health and reflection services only:

- each request message may be at most ``ANONYMOUS_MESSAGE_BYTES``; a larger one is refused with
  RESOURCE_EXHAUSTED before it is parsed (the server's global receive limit has already kept it
  below ``MAX_RECEIVE_BYTES``);
- at most ``ANONYMOUS_CONCURRENCY`` unary calls (and as many streams) are in progress at once; one
  more waits ``ANONYMOUS_WAIT_SECONDS`` for a slot, then is refused with RESOURCE_EXHAUSTED;
- enrollments are accepted at ``ENROLL_RATE_PER_SECOND`` (all callers together), the rest are
  refused with RESOURCE_EXHAUSTED (the agent retries with backoff).

Every refusal goes to ``REFUSALS`` (rate-limited log lines), never one line per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from tether.controller.config import ControllerConfig
from tether.controller.limits import (
    ANONYMOUS_CONCURRENCY,
    ANONYMOUS_WAIT_SECONDS,
    ENROLL_BURST,
    ENROLL_RATE_PER_SECOND,
    TokenBucket,
)
from tether.controller.refusals import REFUSALS, RefusalLog
from tether.nodeagent.limits import ANONYMOUS_MESSAGE_BYTES

if TYPE_CHECKING:
    Handler = grpc.RpcMethodHandler[Any, Any]
ENROLL = "/tether.v1.AgentService/Enroll"
OPEN_METHODS = frozenset(
    {
        ENROLL,
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/List",
        "/grpc.health.v1.Health/Watch",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    }
)


@dataclass(frozen=True)
class Oversize:
    """What the deserializer hands on instead of a message that is over the limit."""

    size: int


def enroll_bucket(config: ControllerConfig) -> TokenBucket:
    """The enrollment rate limit, from ``tether-controller serve --enroll-rate``."""
    return TokenBucket(
        rate=config.enroll_rate_per_second, burst=max(ENROLL_BURST, config.enroll_rate_per_second)
    )


def _bounded(deserialize: Callable[[bytes], Any] | None, limit: int) -> Callable[[bytes], Any]:
    def parse(raw: bytes) -> Any:
        if len(raw) > limit:
            return Oversize(len(raw))
        return deserialize(raw) if deserialize is not None else raw

    return parse


class Guard(grpc.aio.ServerInterceptor):
    """Size, concurrency and rate limits on ``methods`` (by default: every call open to anonymous)."""

    def __init__(
        self,
        methods: Iterable[str] = OPEN_METHODS,
        *,
        message_bytes: int = ANONYMOUS_MESSAGE_BYTES,
        concurrency: int = ANONYMOUS_CONCURRENCY,
        wait_seconds: float = ANONYMOUS_WAIT_SECONDS,
        enroll: TokenBucket | None = None,
        refusals: RefusalLog = REFUSALS,
    ) -> None:
        self._methods = frozenset(methods)
        self._message_bytes = message_bytes
        self._concurrency = concurrency
        self._wait = wait_seconds
        self._unary = asyncio.Semaphore(concurrency)
        self._streams = asyncio.Semaphore(concurrency)  # long-lived: they must not starve Enroll
        self._enroll = enroll or TokenBucket(rate=ENROLL_RATE_PER_SECOND, burst=ENROLL_BURST)
        self._refusals = refusals
        self._wrapped: dict[str, tuple[Handler, Handler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(details)
        method: str = details.method
        if handler is None or method not in self._methods:
            return handler
        # The wrapper holds no state of a call: one per method, made again if the handler changes.
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler, method)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, handler: Handler, method: str) -> Handler:
        parse = _bounded(handler.request_deserializer, self._message_bytes)
        serialize = handler.response_serializer
        if handler.request_streaming and handler.response_streaming:
            inner = handler.stream_stream
            return grpc.stream_stream_rpc_method_handler(
                self._streaming(method, inner, True), parse, serialize
            )
        if handler.response_streaming:
            inner = handler.unary_stream
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(method, inner, False), parse, serialize
            )
        if handler.request_streaming:  # none of the open methods today; guarded all the same
            inner = handler.stream_unary
            return grpc.stream_unary_rpc_method_handler(
                self._unary_call(method, inner, True), parse, serialize
            )
        return grpc.unary_unary_rpc_method_handler(
            self._unary_call(method, handler.unary_unary, False), parse, serialize
        )

    def _unary_call(self, method: str, inner: Any, request_streaming: bool) -> Any:
        async def behavior(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            request = await self._admit(method, request, context, request_streaming)
            async with self._slot(self._unary, method, context):
                try:
                    return await inner(request, context)
                finally:
                    if method == ENROLL and _refused(context):
                        # Only enrollments that happen count: junk (a wrong token, a bad CSR)
                        # cannot use up the rate that real nodes need.
                        self._enroll.give_back()

        return behavior

    def _streaming(self, method: str, inner: Any, request_streaming: bool) -> Any:
        async def behavior(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            request = await self._admit(method, request, context, request_streaming)
            async with self._slot(self._streams, method, context):
                result = inner(request, context)
                if inspect.isasyncgen(result):
                    async for item in result:
                        yield item
                else:
                    await result

        return behavior

    async def _admit(
        self, method: str, request: Any, context: grpc.aio.ServicerContext[Any, Any], request_streaming: bool
    ) -> Any:
        """The request as the handler should see it, or an abort (too large, over the rate)."""
        if request_streaming:
            return self._checked(method, request, context)
        if isinstance(request, Oversize):
            await self._refuse(context, method, grpc.StatusCode.RESOURCE_EXHAUSTED, self._too_large(request))
        if method == ENROLL and not self._enroll.take():
            message = f"enrollment rate limit reached ({self._enroll.rate:g} a second); try again shortly"
            await self._refuse(context, method, grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        return request

    async def _checked(
        self, method: str, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        async for request in requests:
            if isinstance(request, Oversize):
                await self._refuse(
                    context, method, grpc.StatusCode.RESOURCE_EXHAUSTED, self._too_large(request)
                )
            yield request

    def _too_large(self, request: Oversize) -> str:
        return (
            f"request of {request.size} bytes is over the limit of {self._message_bytes} bytes "
            "for calls open to the anonymous enrollment identity"
        )

    @contextlib.asynccontextmanager
    async def _slot(
        self, semaphore: asyncio.Semaphore, method: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[None]:
        """One of the guard's slots for the call, or the call refused after a short wait."""
        try:
            if semaphore.locked():
                await asyncio.wait_for(semaphore.acquire(), self._wait)
            else:  # a free slot is taken at once: no task, no timer, no extra turn of the loop
                await semaphore.acquire()
        except TimeoutError:
            message = (
                "too many calls open to the anonymous enrollment identity in progress "
                f"(at most {self._concurrency}); try again shortly"
            )
            await self._refuse(context, method, grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        try:
            yield
        finally:
            semaphore.release()

    async def _refuse(
        self, context: grpc.aio.ServicerContext[Any, Any], method: str, code: grpc.StatusCode, message: str
    ) -> None:
        self._refusals.refused(
            "call refused", method=method, code=code.name, reason=message, peer=context.peer()
        )
        await context.abort(code, message)


def _refused(context: grpc.aio.ServicerContext[Any, Any]) -> bool:
    """The handler ended the call with an error (a success leaves no code set, or OK)."""
    code: grpc.StatusCode | None = context.code()
    return code is not None and code != grpc.StatusCode.OK
