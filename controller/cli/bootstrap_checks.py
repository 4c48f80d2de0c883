"""What ``tetherctl bootstrap`` checks with the controller before it connects to any machine.

The inventory (or the command line) has been parsed already, roles included; here every
environment the run names must exist on the controller. Every problem is reported at once, in one
error, and no machine is reached over SSH or SSM while any remains.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from tether.bootstrap.inventory import Entry
from tether.controller import wire
from tether.controller.adminconf import AdminConfig
from tether.controller.cli.bootstrap_admin import aio_channel
from tether.controller.cli.client import CliError
from tether.nodeagent.model import Role

TIMEOUT = 30.0


def _roles(entries: Sequence[Entry]) -> list[str]:
    """The role problems (the inventory checks them too; the command line goes through it)."""
    problems = []
    for e in entries:
        try:
            Role.parse(e.role or "worker")
        except ValueError as exc:
            problems.append(f"{e.name or e.target}: {exc}")
    return problems


async def _missing_environments(stub: Any, entries: Sequence[Entry], controller: str) -> list[str]:
    by_env: dict[str, list[str]] = {}
    for e in entries:
        by_env.setdefault(e.env, []).append(e.name or e.target)
    problems = []
    for env, machines in sorted(by_env.items()):
        try:
            await stub.GetEnvironment(wire.admin.GetEnvironmentRequest(name=env), timeout=TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise CliError(
                    f"cannot check environment {env!r} with the controller at {controller}: "
                    f"{exc.details() or exc.code().name}"
                ) from None
            problems.append(f"environment {env!r} not found on the controller (for {', '.join(machines)})")
    return problems


async def check_before_connecting(stub: Any, entries: Sequence[Entry], controller: str) -> None:
    """Raise one ``CliError`` naming every problem, or return when the run may start."""
    missing = await _missing_environments(stub, entries, controller)
    problems = _roles(entries) + missing
    if not problems:
        return
    hint = " (tetherctl env list shows the environments there)" if missing else ""
    if len(problems) == 1:
        raise CliError(f"{problems[0]}{hint}: no machine was contacted")
    raise CliError("no machine was contacted:\n  " + "\n  ".join(problems) + hint)


async def check_with_controller(conf: AdminConfig, entries: Sequence[Entry]) -> None:
    """``check_before_connecting`` over a channel of its own, closed before any machine is reached."""
    channel = aio_channel(conf)
    try:
        await check_before_connecting(wire.AdminServiceStub(channel), entries, conf.controller)
    finally:
        await channel.close()
