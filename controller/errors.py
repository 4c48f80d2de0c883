"""Errors of the controller and tetherctl.

Hierarchy::

    ControllerError            root; ``code`` is the gRPC status it maps to
    ├── NotFound               no such environment, node, token ...
    ├── AlreadyExists
    ├── InvalidArgument        bad request; ``problems`` lists every one
    ├── PermissionDenied       the caller's identity may not do this
    ├── Unauthenticated        no usable identity
    ├── FailedPrecondition     e.g. deleting an environment that still has nodes
    ├── TokenRejected          a join token was refused; the message says why
    ├── ResourceExhausted      a per-node rate or quota was exceeded; the message says when to retry
    └── StoreError             the database cannot be opened (corrupt, or from a newer controller)
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc


class ControllerError(Exception):
    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    retryable = False


class NotFound(ControllerError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(ControllerError):
    code = grpc.StatusCode.ALREADY_EXISTS


class InvalidArgument(ControllerError):
    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems) or [message]


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
