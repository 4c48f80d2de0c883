"""Maps our exceptions to gRPC status codes at the servicer seam (one place).

Every ``ControllerError`` ends the call with its ``code`` (docs/admin-api.md, "Errors"); an
``InvalidArgument`` also carries a ``google.rpc.Status`` whose details hold a
``google.rpc.BadRequest``: one field violation per problem (``field``: the spec path). The plain
status message is the problems, one per line, for clients that read only that. Both together
stay within ``ERROR_STATUS_BYTES`` (problems past it are counted in a last line, not listed; the
first is always listed, its description cut to fit). A problem whose message is the error's own
(a request field's, e.g. ``page_token``) is its message alone in the plain message.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc.error_details_pb2 import BadRequest
from google.rpc.status_pb2 import Status
from grpc_status import rpc_status

from tether.controller import metrics
from tether.controller.errors import ControllerError, InvalidArgument, Problem
from tether.controller.limits import ERROR_STATUS_BYTES
from tether.nodeagent import logs

log = logs.get_logger("tether.controller.rpc")
_STATUS_OVERHEAD = 256  # code, the BadRequest's type URL, framing, and the "N more" line's room
R = TypeVar("R")


def _wire_len(text: str) -> int:
    """Bytes of ``text`` as a grpc-message trailer (percent-encoded outside printable ASCII)."""
    return sum(1 if 0x20 <= b <= 0x7E and b != 0x25 else 3 for b in text.encode())


def _line(exc: InvalidArgument, problem: Problem) -> str:
    """A problem's line in the plain message: ``field: message``, or the message alone where it is
    the error's own (one request field's error, e.g. ``ttl_seconds``, says what it is about)."""
    return problem.message if problem.message == str(exc) else str(problem)


def _cost(problem: Problem, line: str) -> int:
    """What one problem costs: its line in the grpc-message trailer and, base64-encoded in the
    details trailer, that line again (``Status.message``) and its field violation."""
    entry = BadRequest.FieldViolation(field=problem.field, description=problem.message)
    return _wire_len(line) + 3 + (len(line.encode()) + 1 + entry.ByteSize() + 3) * 4 // 3 + 2


def _cut(exc: InvalidArgument, problem: Problem, room: int) -> tuple[Problem, str]:
    """``problem`` with its description cut (ending in "…") to the longest that costs ``room``."""
    bare = _line(exc, problem) == problem.message

    def shortened(keep: int) -> tuple[Problem, str]:
        cut = Problem(problem.field, problem.message[:keep] + "…")
        return cut, cut.message if bare else str(cut)

    low, high = 0, len(problem.message)  # the longest kept prefix fitting lies in [low, high]
    while low < high:
        middle = (low + high + 1) // 2
        if _cost(*shortened(middle)) <= room:
            low = middle
        else:
            high = middle - 1
    return shortened(low)


def _listed(exc: InvalidArgument, budget: int = ERROR_STATUS_BYTES) -> list[tuple[Problem, str]]:
    """The problems that fit the budget, in order, each with its line; the rest counted in one last
    problem. The first is always kept, its description cut to fit if it alone is over."""
    kept: list[tuple[Problem, str]] = []
    used = _STATUS_OVERHEAD
    for problem in exc.violations:
        line = _line(exc, problem)
        cost = _cost(problem, line)
        if used + cost > budget and not kept:
            problem, line = _cut(exc, problem, budget - used)
            cost = _cost(problem, line)
        elif used + cost > budget:
            left = Problem("", f"{len(exc.violations) - len(kept)} more problem(s) not listed")
            kept.append((left, str(left)))
            break
        used += cost
        kept.append((problem, line))
    return kept


def status_of(exc: ControllerError) -> grpc.Status:
    """The status a call ends with: code and message, and for a bad request its field violations
    (the message: one line per problem, as the violations say them)."""
    if not isinstance(exc, InvalidArgument):
        return rpc_status.to_status(Status(code=exc.code.value[0], message=str(exc)))
    listed = _listed(exc)
    bad = BadRequest(
        field_violations=[BadRequest.FieldViolation(field=p.field, description=p.message) for p, _ in listed]
    )
    detail = any_pb2.Any()
    detail.Pack(bad)
    message = "\n".join(line for _, line in listed)
    return rpc_status.to_status(Status(code=exc.code.value[0], message=message, details=[detail]))


def unary(fn: Callable[[Any, Any, Any], Awaitable[R]]) -> Callable[[Any, Any, Any], Awaitable[R]]:
    observe, failed = metrics.timed_method(fn.__name__)  # tether_rpc_* by method

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: Any) -> R:
        started = time.perf_counter()
        try:
            return await fn(self, request, context)
        except ControllerError as exc:
            failed(exc.code.name)
            await context.abort_with_status(status_of(exc))
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
            await context.abort_with_status(status_of(exc))
        except Exception:
            log.exception("internal error", method=fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {fn.__name__}")

    return wrapper
