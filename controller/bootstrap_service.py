"""``AdminService.Bootstrap``: the controller adopts a machine for a gRPC client.

The same pipeline as ``tetherctl bootstrap`` (``tether.bootstrap.install.adopt``), run inside the
controller: join tokens come straight from the store, node records from the store and the hub.
The request's credentials are wrapped in ``Secret`` for the length of the call and dropped with
it; they are never stored or logged (the process redactor masks them in case a library tries).

- SSH: host keys are verified against the request's ``known_hosts``/``host_key`` and the
  controller's own ``DATA_DIR/known_hosts``, where trust-on-first-use (only when asked) records
  new keys.
- SSM: the node downloads the agent bundle from a bundle server the controller runs for the call
  on its listen address (the URL uses the host the node is told to dial), or from S3 through a
  presigned URL when ``bundle_s3_uri`` is set. The controller's own AWS credentials are used.

Agent bundles are built once per Python version and architecture and cached in
``DATA_DIR/bundles`` (or ``$TETHER_BUNDLE_CACHE``); ``pip download`` needs the controller host to
reach a package index, or ``$TETHER_WHEEL_DIR``, a directory of wheels.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from tether.bootstrap import ssh, ssm
from tether.bootstrap.bundle import BundleBuilder
from tether.bootstrap.bundle_http import BundleServer
from tether.bootstrap.delivery import Delivery, Push, S3Presigned, Served
from tether.bootstrap.errors import ControllerError as BootstrapControllerError
from tether.bootstrap.events import BootstrapEvent
from tether.bootstrap.hostkeys import HostKeyPolicy
from tether.bootstrap.install import Opener, Request, adopt
from tether.bootstrap.registry import JoinToken, NodeView
from tether.bootstrap.transport import Transport
from tether.controller import audit, tokens, wire
from tether.controller.app import App
from tether.controller.auth import Principal
from tether.controller.errors import InvalidArgument, NotFound
from tether.controller.listen import WILDCARDS
from tether.controller.nodestate import node_state
from tether.nodeagent import logs
from tether.nodeagent.controllers import split_addresses
from tether.nodeagent.identity import split_address
from tether.nodeagent.model import Role, now_ms
from tether.nodeagent.secrets import PROCESS_REDACTOR, Redactor, Secret

log = logs.get_logger("tether.controller.bootstrap")
DEFAULT_VERIFY_SECONDS = 180
_builders: dict[Path, BundleBuilder] = {}


class StoreRegistry:
    """``tether.bootstrap.registry.Registry`` over the controller's own store."""

    def __init__(self, app: App, who: str, may_see: Callable[[str], bool] = lambda environment: True) -> None:
        self.app = app
        self.who = who
        self.may_see = may_see  # the caller's scope: a node of another environment is not shown
        self.ca_hash = app.ca.ca_hash

    async def get_node(self, name: str) -> NodeView | None:
        node = self.app.store.get_node(name)
        if node is None:
            return None
        if not self.may_see(node.environment):
            raise BootstrapControllerError(
                f"node {name!r} belongs to an environment outside the scope of admin {self.who!r}"
            )
        connected = self.app.hub.connected(name)
        state = node_state(node, self.app.store.node_steps(name), connected).value
        return NodeView(
            node.name, node.environment, node.role, node.revoked, connected, state, node.cert_fingerprint
        )

    async def require_environment(self, name: str) -> None:
        if self.app.store.get_environment(name) is None:
            raise BootstrapControllerError(f"environment {name!r} not found")

    async def create_token(
        self, *, environment: str, role: str, node_name: str, ttl_seconds: int, description: str
    ) -> JoinToken:
        token_id, token = tokens.generate()
        now = now_ms()
        record = tokens.TokenRecord(
            id=token_id,
            secret_hash=tokens.hash_secret(token.reveal().split(".", 1)[1]),
            environment=environment,
            role=Role.parse(role).value,
            node_name=node_name,
            expires_ms=now + ttl_seconds * 1000,
            max_uses=1,
            uses=0,
            revoked=False,
            created_ms=now,
            description=description,
        )
        await self.app.store.put_token(record)
        log.info(
            "join token created for a bootstrap",
            token_id=token_id,
            node=node_name,
            environment=environment,
            by=self.who,
        )
        return JoinToken(token, token_id, self.app.ca.ca_hash)

    async def revoke_token(self, token_id: str) -> None:
        await self.app.store.revoke_token(token_id)


def _builder(app: App) -> BundleBuilder:
    cache = Path(os.environ.get("TETHER_BUNDLE_CACHE", "") or app.config.data_dir / "bundles")
    if cache not in _builders:
        _builders[cache] = BundleBuilder(cache)  # PipWheels honours $TETHER_WHEEL_DIR
    return _builders[cache]


def _ssh_opener(app: App, target: Any, redactor: Redactor) -> tuple[str, Opener, list[Secret]]:
    if not target.host:
        raise InvalidArgument("ssh.host is required")
    credentials = ssh.SshCredentials(
        private_key=Secret(bytes(target.private_key).decode("utf-8", errors="replace")),
        passphrase=Secret(target.passphrase),
        password=Secret(target.password),
    )
    for secret in credentials.secrets():
        redactor.add(secret)
    user = target.user or "root"
    try:
        endpoint = ssh.SshEndpoint(target.host, target.port or ssh.DEFAULT_PORT, user)
        jump = ssh.SshEndpoint.parse(target.jump_host, user) if target.jump_host else None
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    policy = HostKeyPolicy(
        known_hosts=(app.config.data_dir / "known_hosts",),
        pinned=target.host_key,
        accept_new=target.accept_new_host_key,
        inline=target.known_hosts,
    )
    ssh_target = ssh.SshTarget(endpoint, credentials, policy, jump)

    async def opener() -> Transport:
        return await ssh.connect(ssh_target)

    return str(ssh_target), opener, list(credentials.secrets())


def _ssm_opener(target: Any) -> tuple[str, Opener]:
    if not target.instance_id or not target.region:
        raise InvalidArgument("ssm.instance_id and ssm.region are required")
    ssm_target = ssm.SsmTarget(target.instance_id, target.region, target.endpoint_url)

    async def opener() -> Transport:
        return await ssm.connect(ssm_target)

    return str(ssm_target), opener


def _s3_client(target: Any) -> Any:
    import boto3

    return boto3.client("s3", region_name=target.region, endpoint_url=target.s3_endpoint_url or None)


def event_to_pb(event: BootstrapEvent) -> Any:
    msg = wire.admin.BootstrapEvent(
        step=event.step.value,
        kind=event.kind.label,
        message=event.message,
        time_ms=event.time_ms,
        node=event.node,
        target=event.target,
        outcome=event.outcome.value if event.outcome else "",
        retryable=event.retryable,
    )
    if event.detected is not None:
        msg.detected.CopyFrom(wire.facts_to_pb(event.detected))
    return msg


async def run(app: App, request: Any, caller: Principal) -> AsyncIterator[Any]:
    """Adopt the machine of ``request``, yielding ``BootstrapEvent`` messages as it goes.

    An unknown environment or role, or one outside the caller's scope, is refused before the
    machine is contacted at all.
    """
    if not request.environment:
        raise InvalidArgument("environment is required")
    audit.note(environment=request.environment, node=request.node_name)
    caller.require_environment(request.environment)
    who = caller.name
    try:
        role = Role.parse(request.role or "worker").value
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    if app.store.get_environment(request.environment) is None:  # refused before any SSH or SSM
        raise NotFound(f"environment {request.environment!r} not found")
    redactor = Redactor()
    held: list[Secret] = []
    try:
        kind = request.WhichOneof("target")
        if kind == "ssh":
            label, opener, held = _ssh_opener(app, request.ssh, redactor)
            PROCESS_REDACTOR.add(*held)  # masked in every log line of this process while the call runs
        elif kind == "ssm":
            label, opener = _ssm_opener(request.ssm)
        else:
            raise InvalidArgument("a target is required: ssh or ssm")
        controller = request.controller or app.advertise
        try:
            addresses = split_addresses(controller)  # several replicas: A,B (the node tries each)
        except ValueError as exc:
            raise InvalidArgument(f"controller: {exc}") from None
        plan = Request(
            environment=request.environment,
            role=role,
            controller=controller,
            node_name=request.node_name,
            force=request.force,
            verify_timeout=float(request.verify_timeout_seconds or DEFAULT_VERIFY_SECONDS),
        )
        log.info("bootstrap requested", target=label, environment=plan.environment, role=role, by=who)
        events: asyncio.Queue[BootstrapEvent] = asyncio.Queue()
        async with contextlib.AsyncExitStack() as stack:
            delivery: Delivery = Push()
            if kind == "ssm" and request.ssm.bundle_s3_uri:
                try:
                    delivery = S3Presigned(request.ssm.bundle_s3_uri, _s3_client(request.ssm))
                except ValueError as exc:
                    raise InvalidArgument(str(exc)) from None
            elif kind == "ssm":
                listen_host = split_address(app.config.listen)[0]
                server = BundleServer(
                    "0.0.0.0" if listen_host in WILDCARDS else listen_host,  # noqa: S104 (the controller's own choice)
                    # this replica serves it: its own address when listed
                    advertise_host=split_address(
                        app.advertise if app.advertise in addresses else addresses[0]
                    )[0],
                )
                delivery = Served(await stack.enter_async_context(server), "downloaded from the controller")
            task = asyncio.create_task(
                adopt(
                    opener,
                    label,
                    plan,
                    registry=StoreRegistry(app, who, caller.may_see),
                    bundles=_builder(app),
                    delivery=delivery,
                    sink=events.put_nowait,
                    redactor=redactor,
                )
            )
            try:
                while not (task.done() and events.empty()):
                    getter = asyncio.ensure_future(events.get())
                    await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                    if getter.done():
                        yield event_to_pb(getter.result())
                    else:
                        getter.cancel()
                result = task.result()
                audit.note(node=result.node)
                log.info(
                    "bootstrap finished",
                    target=label,
                    node=result.node,
                    outcome=result.outcome.value,
                    seconds=round(result.seconds, 1),
                    by=who,
                )
            finally:
                if not task.done():
                    task.cancel()  # the client went away: stop, and close the connection to the machine
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
    finally:
        PROCESS_REDACTOR.discard(*held)  # the credentials lived for this call only
