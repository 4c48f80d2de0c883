"""Admin API errors as exceptions: one class per canonical gRPC code, with the field violations.

``from_rpc_error`` turns a ``grpc.RpcError`` into the matching ``ApiError`` subclass; a validation
failure (``INVALID_ARGUMENT``) carries one ``FieldViolation`` per problem, read from the
``google.rpc.BadRequest`` in the status details (``field`` is the spec path, e.g.
``spec.kernel.version``). See docs/admin-api.md, "Errors".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from google.rpc.error_details_pb2 import BadRequest
from google.rpc.status_pb2 import Status
from grpc_status import rpc_status


@dataclass(frozen=True)
class FieldViolation:
    """One problem of a request: where (``field``, a dotted path; may be empty) and what."""

    field: str
    description: str

    def __str__(self) -> str:
        return f"{self.field}: {self.description}" if self.field else self.description


class ApiError(Exception):
    """A failed admin API call: the gRPC ``code``, the server's ``message`` and its field violations."""

    default_code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = None,
        field_violations: Sequence[FieldViolation] = (),
    ) -> None:
        super().__init__(message)
        self.code: grpc.StatusCode = code or self.default_code
        self.message = message
        self.field_violations: list[FieldViolation] = list(field_violations)


class InvalidArgumentError(ApiError):
    default_code = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(ApiError):
    default_code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(ApiError):
    default_code = grpc.StatusCode.ALREADY_EXISTS


class AbortedError(ApiError):
    """A concurrent change won (e.g. a stale ``expected_generation``): read again, then retry."""

    default_code = grpc.StatusCode.ABORTED


class PermissionDeniedError(ApiError):
    default_code = grpc.StatusCode.PERMISSION_DENIED


class UnauthenticatedError(ApiError):
    default_code = grpc.StatusCode.UNAUTHENTICATED


class FailedPreconditionError(ApiError):
    default_code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhaustedError(ApiError):
    default_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class UnavailableError(ApiError):
    default_code = grpc.StatusCode.UNAVAILABLE


class OutOfRangeError(ApiError):
    """A position no longer (or not yet) kept, e.g. a watch's revision: list again."""

    default_code = grpc.StatusCode.OUT_OF_RANGE


_BY_CODE: dict[grpc.StatusCode, type[ApiError]] = {
    cls.default_code: cls
    for cls in (
        InvalidArgumentError,
        NotFoundError,
        AlreadyExistsError,
        AbortedError,
        PermissionDeniedError,
        UnauthenticatedError,
        FailedPreconditionError,
        ResourceExhaustedError,
        UnavailableError,
        OutOfRangeError,
    )
}


def _rich_status(exc: grpc.RpcError) -> Status | None:
    """The ``google.rpc.Status`` in the trailers, or None (absent, or not a call's error)."""
    try:
        status: Status | None = rpc_status.from_call(exc)  # type: ignore[arg-type]
    except (AttributeError, TypeError, ValueError):  # no trailers, or they disagree with the call
        return None
    return status


def field_violations(status: Status | None) -> list[FieldViolation]:
    """Every ``google.rpc.BadRequest`` field violation in a status's details, in order."""
    found: list[FieldViolation] = []
    for detail in status.details if status is not None else ():
        bad = BadRequest()
        if detail.Unpack(bad):  # False for a detail of another type
            found.extend(FieldViolation(v.field, v.description) for v in bad.field_violations)
    return found


def from_rpc_error(exc: grpc.RpcError) -> ApiError:
    """The ``ApiError`` for a failed call (``UNKNOWN`` and other codes: a plain ``ApiError``)."""
    code_of = getattr(exc, "code", None)
    details_of = getattr(exc, "details", None)
    code = code_of() if callable(code_of) else grpc.StatusCode.UNKNOWN
    message = (details_of() if callable(details_of) else None) or str(exc)
    cls = _BY_CODE.get(code, ApiError)
    return cls(message, code=code, field_violations=field_violations(_rich_status(exc)))
