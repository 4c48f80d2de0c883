"""The admin connection: admin.conf -> an authenticated AdminService stub, errors mapped once."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import grpc

from tether.controller import wire
from tether.controller.adminconf import AdminConfig
from tether.controller.documents import check_size
from tether.controller.errors import InvalidArgument
from tether.nodeagent.identity import CONTROLLER_SERVER_NAME
from tether.nodeagent.limits import client_options

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


def context_name(flag: str | None) -> str:
    """The context to use: ``--context``, else ``$TETHER_CONTEXT``, else the file's current one."""
    return flag or os.environ.get("TETHER_CONTEXT", "")


def load_config(args: argparse.Namespace) -> AdminConfig:
    """The admin config the arguments name (``--config``, ``--context`` or their variables)."""
    try:
        return AdminConfig.read(config_path(args.config), context_name(getattr(args, "context", None)))
    except Exception as exc:
        raise CliError(f"{exc} (use --config/TETHER_CONFIG, --context/TETHER_CONTEXT)") from None


def channel_options() -> list[tuple[str, int | str]]:
    """tetherctl's channel options: the shared message limits, the controller's certificate name."""
    return [*client_options(), ("grpc.ssl_target_name_override", CONTROLLER_SERVER_NAME)]


def connect(
    flag: str | None, context: str | None = None
) -> tuple[wire.AdminServiceStub, AdminConfig, grpc.Channel]:
    conf = load_config(argparse.Namespace(config=flag, context=context))
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
        self.stub, self.conf, self.channel = connect(args.config, getattr(args, "context", None))
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
