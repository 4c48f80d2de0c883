"""tetherctl's admin connection: the SDK's ``Client`` from admin.conf, errors made one clear message."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from tether.controller import wire
from tether.controller.adminconf import AdminConfig
from tether.controller.client import Client, ConfigError
from tether.controller.client.connection import (
    DEFAULT_CONFIG,
    channel_options,
    config_path,
    context_name,
    read_admin_conf,
)
from tether.controller.client.errors import ApiError
from tether.controller.documents import check_size
from tether.controller.errors import InvalidArgument

T = TypeVar("T")
STORE_UNAVAILABLE = "store unavailable:"  # how a controller's StoreError begins (UNAVAILABLE too)
__all__ = [
    "DEFAULT_CONFIG",
    "CliError",
    "Session",
    "channel_options",
    "check_size_here",
    "client_for",
    "config_path",
    "connect",
    "context_name",
    "explain",
    "load_config",
    "read_input",
]


class CliError(Exception):
    """A message for the operator; tetherctl prints it on stderr and exits non-zero."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _config_error(exc: ConfigError) -> CliError:
    return CliError(f"{exc} (use --config/TETHER_CONFIG, --context/TETHER_CONTEXT)")


def load_config(args: argparse.Namespace) -> AdminConfig:
    """The admin config the arguments name (``--config``, ``--context`` or their variables)."""
    try:
        return read_admin_conf(args.config, getattr(args, "context", None))
    except ConfigError as exc:
        raise _config_error(exc) from None


def client_for(args: argparse.Namespace) -> Client:
    """The SDK client tetherctl's flags name (``--config``, ``--context``, ``--timeout``)."""
    try:
        return Client.from_admin_conf(
            args.config, getattr(args, "context", None), timeout=getattr(args, "timeout", None)
        )
    except ConfigError as exc:
        raise _config_error(exc) from None


def connect(
    flag: str | None, context: str | None = None
) -> tuple[wire.AdminServiceStub, AdminConfig, grpc.Channel]:
    client = client_for(argparse.Namespace(config=flag, context=context, timeout=None))
    assert client.config is not None
    return client.stub, client.config, client.channel


def explain(exc: grpc.RpcError | ApiError, address: str = "") -> CliError:
    if isinstance(exc, ApiError):
        cause = exc.__cause__
        if isinstance(cause, grpc.RpcError):
            return explain(cause, address)
        return CliError(exc.message or exc.code.name)
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.UNAVAILABLE and (details or "").startswith(STORE_UNAVAILABLE):
        return CliError(f"the controller at {address} answered: {details}")  # reached; its database not
    if code == grpc.StatusCode.UNAVAILABLE:
        return CliError(f"cannot reach the controller at {address}: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return CliError(f"the controller at {address} did not answer in time")
    return CliError(details or (code.name if code else "request failed"))


def read_input(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None


class Session:
    """The SDK client of one tetherctl run (``stub`` for any call); RPC errors become one message."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.client = client_for(args)
        assert self.client.config is not None
        self.stub, self.conf, self.channel = self.client.stub, self.client.config, self.client.channel
        self.timeout = args.timeout

    def call(self, method: str, request: Any) -> Any:
        try:
            return self.client.call(getattr(self.stub, method), request)
        except ApiError as exc:
            raise explain(exc, self.conf.controller) from None

    def collect(self, items: Iterable[T]) -> list[T]:
        """Every item of an SDK iterator (all its pages), RPC errors made one message."""
        try:
            return list(items)
        except ApiError as exc:
            raise explain(exc, self.conf.controller) from None


def check_size_here(document: str, args: argparse.Namespace) -> None:
    """The controller's size check, here with the same number: one line, before anything is sent."""
    try:
        check_size(document, args.max_document_bytes)
    except InvalidArgument as exc:
        raise CliError(str(exc)) from None
