"""Errors of the controller and tetherctl.

Hierarchy::

    ControllerError            root; ``code`` is the gRPC status it maps to
    ├── NotFound               no such environment, node, token ...
    ├── AlreadyExists
    ├── InvalidArgument        bad request; ``problems`` lists every one (``violations``: with its field)
    ├── Aborted                a concurrent change won (a stale expected generation)
    ├── PermissionDenied       the caller's identity may not do this
    ├── Unauthenticated        no usable identity
    ├── FailedPrecondition     e.g. deleting an environment that still has nodes
    ├── TokenRejected          a join token was refused; the message says why
    ├── ResourceExhausted      a per-node rate or quota was exceeded; the message says when to retry
    └── StoreError             the database cannot be opened (corrupt, or from a newer controller)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc


class ControllerError(Exception):
    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    retryable = False


class NotFound(ControllerError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(ControllerError):
    code = grpc.StatusCode.ALREADY_EXISTS


@dataclass(frozen=True)
class Problem:
    """One problem of a request: ``field`` is its path (``spec.kernel.version``; "" for none)."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class InvalidArgument(ControllerError):
    """``problems``: one line per problem (``path: message``); ``violations``: the same, structured."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, message: str, problems: Sequence[str | Problem] = ()) -> None:
        super().__init__(message)
        given = list(problems) or [message]
        self.violations = [p if isinstance(p, Problem) else Problem("", p) for p in given]
        self.problems = [str(p) for p in given]


class Aborted(ControllerError):
    """A concurrent change won (e.g. an apply at a stale generation): read again, then retry."""

    code = grpc.StatusCode.ABORTED


def check_generation(environment: str, current: int | None, expected: int) -> None:
    """Raise ``Aborted`` unless ``expected`` is 0 (no check) or the ``current`` generation (None:
    the environment does not exist)."""
    if not expected or current == expected:
        return
    if current is None:
        raise Aborted(f"environment {environment!r} does not exist (expected at generation {expected})")
    raise Aborted(f"environment {environment!r} is at generation {current}, not {expected}")


class PermissionDenied(ControllerError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(ControllerError):
    code = grpc.StatusCode.UNAUTHENTICATED


class FailedPrecondition(ControllerError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class TokenRejected(ControllerError):
    """Why a join token was refused: invalid, expired, used up, revoked or out of scope."""

    code = grpc.StatusCode.PERMISSION_DENIED

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ResourceExhausted(ControllerError):
    """Over a rate or quota; ``retry_after_s`` says when trying again can succeed (0: unknown)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    retryable = True

    def __init__(self, message: str, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class StoreError(ControllerError):
    """The store cannot be used; the message names the file and what to do."""

    code = grpc.StatusCode.UNAVAILABLE


class OutOfRange(ControllerError):
    """A position no longer (or not yet) kept, e.g. a watch's revision: list again."""

    code = grpc.StatusCode.OUT_OF_RANGE
