"""The bootstrap's view of the controller from tetherctl: the admin API over grpc.aio.

``AdminRegistry`` gives ``tether.bootstrap.install`` node records and single-use join tokens;
``remote_adopt`` asks the controller to adopt a machine itself (``AdminService.Bootstrap``) and
turns its event stream back into ``BootstrapEvent`` values and a ``Result``.
"""

from __future__ import annotations

import time
from typing import Any

import grpc

from tether.bootstrap.detect import DetectedHost
from tether.bootstrap.errors import BootstrapError, ControllerError
from tether.bootstrap.events import BootstrapEvent, EventSink, Outcome, Step
from tether.bootstrap.install import Result
from tether.bootstrap.registry import JoinToken, NodeView
from tether.controller import wire
from tether.controller.adminconf import AdminConfig
from tether.controller.cli.client import channel_options
from tether.nodeagent.model import EventKind
from tether.nodeagent.secrets import Secret

TIMEOUT = 30.0


def aio_channel(conf: AdminConfig) -> grpc.aio.Channel:
    creds = grpc.ssl_channel_credentials(conf.ca_pem, conf.key_pem, conf.cert_pem)
    return grpc.aio.secure_channel(conf.controller, creds, options=channel_options())


def _refused(exc: grpc.aio.AioRpcError, what: str) -> ControllerError:
    return ControllerError(f"{what}: {exc.details() or exc.code().name}")


class AdminRegistry:
    """``tether.bootstrap.registry.Registry`` over the admin gRPC API."""

    def __init__(self, stub: Any, ca_hash: str) -> None:
        self.stub = stub
        self.ca_hash = ca_hash

    async def get_node(self, name: str) -> NodeView | None:
        try:
            node = await self.stub.GetNode(wire.admin.GetNodeRequest(name=name), timeout=TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise _refused(exc, f"looking up node {name}") from None
        return NodeView(
            node.name,
            node.environment,
            node.role,
            node.state == "revoked",
            node.connected,
            node.state,
            node.cert_fingerprint,
        )

    async def require_environment(self, name: str) -> None:
        try:
            await self.stub.GetEnvironment(wire.admin.GetEnvironmentRequest(name=name), timeout=TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            raise _refused(exc, f"environment {name}") from None

    async def create_token(
        self, *, environment: str, role: str, node_name: str, ttl_seconds: int, description: str
    ) -> JoinToken:
        request = wire.admin.CreateTokenRequest(
            environment=environment,
            role=role,
            ttl_seconds=ttl_seconds,
            uses=1,
            node_name=node_name,
            description=description,
        )
        try:
            reply = await self.stub.CreateToken(request, timeout=TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            raise _refused(exc, "creating a join token") from None
        return JoinToken(Secret(reply.token), reply.info.id, reply.ca_hash or self.ca_hash)

    async def revoke_token(self, token_id: str) -> None:
        try:
            await self.stub.RevokeToken(wire.admin.RevokeTokenRequest(id=token_id), timeout=TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise _refused(exc, f"revoking join token {token_id}") from None


def event_from_pb(msg: Any) -> BootstrapEvent:
    """A controller's bootstrap event; one this tetherctl cannot read is a ``ControllerError``."""
    try:
        step = Step(msg.step)
        kind = EventKind[msg.kind.upper()]
        outcome = Outcome(msg.outcome) if msg.outcome else None
    except (KeyError, ValueError):
        raise ControllerError(
            f"the controller sent a bootstrap event this tetherctl does not know (step {msg.step!r}, "
            f"kind {msg.kind!r}, outcome {msg.outcome!r}): use a tetherctl as new as the controller"
        ) from None
    return BootstrapEvent(
        target=msg.target,
        node=msg.node or msg.target,
        step=step,
        kind=kind,
        message=msg.message,
        time_ms=msg.time_ms,
        detected=wire.facts_from_pb(msg.detected) if msg.HasField("detected") else None,
        outcome=outcome,
        retryable=msg.retryable,
    )


async def remote_adopt(stub: Any, request: Any, target: str, sink: EventSink) -> Result:
    """Let the controller adopt the machine; events go to ``sink`` as they stream in."""
    started = time.monotonic()
    node, detected, done = "", None, None
    try:
        async for msg in stub.Bootstrap(request):
            event = event_from_pb(msg)
            sink(event)
            node = event.node if event.node != event.target else node
            if event.detected is not None:
                detected = DetectedHost(event.detected)
            if event.step is Step.DONE:
                done = event
    except grpc.aio.AioRpcError as exc:
        err = ControllerError(f"the controller refused the bootstrap: {exc.details() or exc.code().name}")
        sink(
            BootstrapEvent(
                target, node or target, Step.DONE, EventKind.FAILED, str(err), 0, None, Outcome.FAILED
            )
        )
        return Result(target, node, Outcome.FAILED, str(err), time.monotonic() - started, detected, err)
    if done is None or done.outcome is None:
        err = ControllerError("the controller's event stream ended without an outcome")
        return Result(target, node, Outcome.FAILED, str(err), time.monotonic() - started, detected, err)
    message = done.message.split(": ", 1)[-1]
    error = None if done.outcome.ok else BootstrapError(message, target=target)
    return Result(target, node, done.outcome, message, time.monotonic() - started, detected, error)
