"""The controller's methods are served by generic handlers; only the agent's are registered with
gRPC core (each registered method costs grpc.aio's server loop work on every call; see
``tether.controller.server._Registrar``). The calls behave as before: the guard, auth errors,
unimplemented methods, health and reflection."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from tether.controller import wire
from tether.controller.app import App
from tether.controller.auth import Authenticator
from tether.controller.ca import CertificateAuthority
from tether.controller.cluster.orchestrator import Orchestrator
from tether.controller.config import ControllerConfig
from tether.controller.guard import Guard
from tether.controller.hub import Hub
from tether.controller.nodewatch import NodeWatch
from tether.controller.planner import Planner
from tether.controller.rollout import RolloutDriver
from tether.controller.secretbox import SecretBox
from tether.controller.server import REGISTERED_METHODS, _add_services
from tether.controller.store import SqliteStore
from tether.nodeagent.limits import ANONYMOUS_MESSAGE_BYTES
from tether.nodeagent.secrets import Redactor
from tether.v1 import admin_pb2, agent_pb2

AGENT = "tether.v1.AgentService"
ADMIN = "tether.v1.AdminService"


def _methods() -> dict[str, list[str]]:
    """Every method the controller serves, by service, from the descriptors."""
    descriptors = [
        agent_pb2.DESCRIPTOR.services_by_name["AgentService"],
        admin_pb2.DESCRIPTOR.services_by_name["AdminService"],
        health_pb2.DESCRIPTOR.services_by_name["Health"],
        reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"],
    ]
    return {d.full_name: [m.name for m in d.methods] for d in descriptors}


class _Recording:
    """The server as the registration code sees it: records what is added, then adds it."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self.server = server
        self.generic: list[grpc.GenericRpcHandler] = []
        self.registered: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        handlers = list(handlers)
        self.generic.extend(handlers)
        self.server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        self.registered.update({f"/{service}/{name}": h for name, h in handlers.items()})
        self.server.add_registered_method_handlers(service, handlers)

    def generic_handler(self, method: str) -> grpc.RpcMethodHandler[Any, Any] | None:
        details = _Details(method)
        for generic in self.generic:
            handler = generic.service(details)
            if handler is not None:
                return handler
        return None


class _Details(grpc.HandlerCallDetails):
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[_Recording, grpc.aio.Channel]]:
    """The controller's services on a real gRPC server (no TLS: every caller is unauthenticated)."""
    store = SqliteStore(tmp_path / "tether.db")
    hub = Hub()
    watch = NodeWatch(store, hub)
    planner = Planner(watch.store)
    cluster = Orchestrator(store, hub, SecretBox.load_or_create(tmp_path / "secrets.key"), Redactor())
    ca = CertificateAuthority.load_or_create(tmp_path / "pki")
    app = App(
        config=ControllerConfig(data_dir=tmp_path),
        ca=ca,
        store=watch.store,
        auth=Authenticator(ca),
        hub=hub,
        planner=planner,
        advertise="127.0.0.1:1",
        cluster=cluster,
        rollouts=RolloutDriver(store, hub, planner, cluster),
        watch=watch,
    )
    server = grpc.aio.server(interceptors=[Guard()])
    recording = _Recording(server)
    health_servicer, _ = _add_services(recording, app)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await health_servicer.set(AGENT, health_pb2.HealthCheckResponse.SERVING)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield recording, channel
    finally:
        await channel.close()
        await server.stop(None)
        await store.close()


async def test_only_the_agents_methods_are_registered_and_generic_handlers_serve_every_method(
    served: tuple[_Recording, grpc.aio.Channel],
) -> None:
    recording, _ = served
    methods = _methods()
    assert set(recording.registered) == REGISTERED_METHODS == {f"/{AGENT}/{m}" for m in methods[AGENT]}
    assert sum(len(names) for names in methods.values()) == 40  # each one a pending request if registered
    for service, names in methods.items():
        for name in names:
            method = f"/{service}/{name}"
            handler = recording.generic_handler(method)
            assert handler is not None, method
            if method in recording.registered:  # the same handler either way
                assert recording.registered[method] is handler
    assert recording.generic_handler(f"/{ADMIN}/NoSuchMethod") is None


async def test_calls_through_generic_handlers_behave_as_registered_ones(
    served: tuple[_Recording, grpc.aio.Channel],
) -> None:
    _, channel = served
    # An admin call: the servicer's auth refusal, with its code and message.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await wire.AdminServiceStub(channel).ListEnvironments(admin_pb2.ListEnvironmentsRequest(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "client certificate" in (refused.value.details() or "")
    # A method nobody serves.
    unknown = channel.unary_unary(f"/{ADMIN}/NoSuchMethod")
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await unknown(b"", timeout=10)
    assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
    # Health: answered, and still under the guard (a request over the anonymous limit).
    checks = health_pb2_grpc.HealthStub(channel)
    reply = await checks.Check(health_pb2.HealthCheckRequest(service=AGENT), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    too_large = health_pb2.HealthCheckRequest(service="x" * (ANONYMOUS_MESSAGE_BYTES + 1))
    with pytest.raises(grpc.aio.AioRpcError) as guarded:
        await checks.Check(too_large, timeout=10)
    assert guarded.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "over the limit" in (guarded.value.details() or "")
    # Reflection lists the services, as before.
    stream = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(timeout=10)
    await stream.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    listed = await stream.read()
    await stream.done_writing()
    names = {s.name for s in listed.list_services_response.service}
    assert names == {*wire.SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME}
