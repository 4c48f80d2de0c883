"""The admin connection: admin.conf -> an authenticated AdminService stub, errors mapped once."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import grpc

from controller import wire
from controller.adminconf import AdminConfig
from controller.documents import check_size
from controller.errors import InvalidArgument
from nodeagent.identity import CONTROLLER_SERVER_NAME
from nodeagent.limits import client_options

DEFAULT_CONFIG = Path.home() / ".config" / "tether" / "admin.conf"


class CliError(Exception):
    """A message for the operator; tetherctl prints it on stderr and exits non-zero."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def config_path(flag: str | None) -> Path:
    if flag:
        return Path(flag)
    env = os.environ.get("TETHER_CONFIG")
    if env:
        return Path(env)
    return DEFAULT_CONFIG


def channel_options() -> list[tuple[str, int | str]]:
    """tetherctl's channel options: the shared message limits, the controller's certificate name."""
    return [*client_options(), ("grpc.ssl_target_name_override", CONTROLLER_SERVER_NAME)]


def connect(flag: str | None) -> tuple[wire.AdminServiceStub, AdminConfig, grpc.Channel]:
    path = config_path(flag)
    try:
        conf = AdminConfig.read(path)
    except Exception as exc:
        raise CliError(f"{exc} (use --config or TETHER_CONFIG)") from None
    creds = grpc.ssl_channel_credentials(conf.ca_pem, conf.key_pem, conf.cert_pem)
    channel = grpc.secure_channel(conf.controller, creds, options=channel_options())
    return wire.AdminServiceStub(channel), conf, channel


def explain(exc: grpc.RpcError, address: str = "") -> CliError:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
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
    """Lazily connected stub; RPC errors become one clear message."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.stub, self.conf, self.channel = connect(args.config)
        self.timeout = args.timeout

    def call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self.stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise explain(exc, self.conf.controller) from None


def check_size_here(document: str, args: argparse.Namespace) -> None:
    """The controller's size check, here with the same number: one line, before anything is sent."""
    try:
        check_size(document, args.max_document_bytes)
    except InvalidArgument as exc:
        raise CliError(str(exc)) from None
