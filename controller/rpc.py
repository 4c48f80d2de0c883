"""Maps our exceptions to gRPC status codes at the servicer seam (one place)."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from tether.controller import metrics
from tether.controller.errors import ControllerError, InvalidArgument
from tether.nodeagent import logs

log = logs.get_logger("tether.controller.rpc")
R = TypeVar("R")


def _message(exc: ControllerError) -> str:
    if isinstance(exc, InvalidArgument):
        return "\n".join(exc.problems)
    return str(exc)


def unary(fn: Callable[[Any, Any, Any], Awaitable[R]]) -> Callable[[Any, Any, Any], Awaitable[R]]:
    observe, failed = metrics.timed_method(fn.__name__)  # tether_rpc_* by method

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: Any) -> R:
        started = time.perf_counter()
        try:
            return await fn(self, request, context)
        except ControllerError as exc:
            failed(exc.code.name)
            await context.abort(exc.code, _message(exc))
            raise AssertionError("unreachable") from None
        except Exception:
            failed(grpc.StatusCode.INTERNAL.name)
            log.exception("internal error", method=fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {fn.__name__}")
            raise AssertionError("unreachable") from None
        finally:
            observe(time.perf_counter() - started)

    return wrapper


def stream(fn: Callable[[Any, Any, Any], AsyncIterator[R]]) -> Callable[[Any, Any, Any], AsyncIterator[R]]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: Any) -> AsyncIterator[R]:
        try:
            async for item in fn(self, request, context):
                yield item
        except ControllerError as exc:
            await context.abort(exc.code, _message(exc))
        except Exception:
            log.exception("internal error", method=fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {fn.__name__}")

    return wrapper
