"""Errors of the controller and tetherctl.

Hierarchy::

    ControllerError            root; ``code`` is the gRPC status it maps to
    ├── NotFound               no such environment, node, token ...
    ├── AlreadyExists
    ├── InvalidArgument        bad request; ``problems`` lists every one
    ├── PermissionDenied       the caller's identity may not do this
    ├── Unauthenticated        no usable identity
    ├── FailedPrecondition     e.g. deleting an environment that still has nodes
    └── TokenRejected          a join token was refused; the message says why
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
