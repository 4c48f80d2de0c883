"""Reaching a controller from an admin.conf, the way tetherctl does: which file, which context, and
the mutual-TLS channel (the admin's certificate, the controller's CA, tether's message limits)."""

from __future__ import annotations

import os
from pathlib import Path

import grpc

from tether.controller.adminconf import AdminConfig
from tether.nodeagent.identity import CONTROLLER_SERVER_NAME
from tether.nodeagent.limits import client_options

DEFAULT_CONFIG = Path.home() / ".config" / "tether" / "admin.conf"


class ConfigError(Exception):
    """The admin config cannot be used (missing, unreadable, not valid, no such context)."""


def config_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The admin config to read: ``path``, else ``$TETHER_CONFIG``, else ~/.config/tether/admin.conf."""
    if path:
        return Path(path)
    env = os.environ.get("TETHER_CONFIG")
    return Path(env) if env else DEFAULT_CONFIG


def context_name(context: str | None = None) -> str:
    """The context to use: ``context``, else ``$TETHER_CONTEXT``, else ("") the file's current one."""
    return context or os.environ.get("TETHER_CONTEXT", "")


def read_admin_conf(path: str | os.PathLike[str] | None = None, context: str | None = None) -> AdminConfig:
    """The controller and credentials ``path`` (and ``context``) name; ConfigError says why not."""
    try:
        return AdminConfig.read(config_path(path), context_name(context))
    except Exception as exc:
        raise ConfigError(str(exc)) from None


def channel_options() -> list[tuple[str, int | str]]:
    """tetherctl's channel options: the shared message limits, the controller's certificate name."""
    return [*client_options(), ("grpc.ssl_target_name_override", CONTROLLER_SERVER_NAME)]


def secure_channel(conf: AdminConfig) -> grpc.Channel:
    """A blocking mutual-TLS channel to ``conf``'s controller (it connects on first use)."""
    creds = grpc.ssl_channel_credentials(conf.ca_pem, conf.key_pem, conf.cert_pem)
    return grpc.secure_channel(conf.controller, creds, options=channel_options())
