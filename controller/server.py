"""Builds and runs the controller's gRPC server (one port, mutual TLS on every call)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import shutil
import signal
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from tether.controller import metrics, wire
from tether.controller.admin_service import AdminService
from tether.controller.agent_service import AgentService
from tether.controller.agentbundles import agent_bundles
from tether.controller.app import App
from tether.controller.auth import Authenticator
from tether.controller.ca import CertificateAuthority
from tether.controller.cluster.orchestrator import Orchestrator
from tether.controller.config import ControllerConfig
from tether.controller.errors import ControllerError
from tether.controller.guard import Guard, enroll_bucket
from tether.controller.hardware.drift import DriftWatch
from tether.controller.hardware.gate import HardwareGate
from tether.controller.hub import Hub
from tether.controller.identity import Identity, StoreKey, ensure_admin_conf, load_identity, load_store_key
from tether.controller.listen import WILDCARDS, ListenError, preflight
from tether.controller.nodewatch import NodeWatch
from tether.controller.planner import Planner
from tether.controller.replicas import delivery
from tether.controller.replicas import wiring as replicas
from tether.controller.rollout import RolloutDriver
from tether.controller.spec import load_document
from tether.controller.spec.model import EnvironmentSpec
from tether.controller.store import NodeRecord, Store, open_store
from tether.controller.transport import server_options
from tether.nodeagent import anonymous, logs, systemd
from tether.nodeagent.facts import local_addresses
from tether.nodeagent.identity import split_address
from tether.nodeagent.secrets import PROCESS_REDACTOR

log = logs.get_logger("tether.controller")


# A controller's heap is large and long-lived (a session, its tasks and its gRPC call per agent).
# With CPython's default thresholds (700, 10, 10) every wave of new sessions (a fleet coming up,
# a reconnect storm) set off full collections that walk all of them and free nothing: about
# 6 s of CPU while 10,000 agents connect. Young generations are still collected every 50,000
# allocations; full collections become rare.
GC_THRESHOLDS = (50_000, 20, 10)


def _join_host(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _serving_names(config: ControllerConfig, host: str) -> tuple[list[str], str]:
    """The names and addresses the serving certificate carries, and the host agents are told."""
    hosts = [host, *config.extra_sans]
    advertise_host = host
    if host in WILDCARDS:
        addrs = local_addresses()
        hosts.extend(addrs)
        advertise_host = addrs[0] if addrs else "127.0.0.1"
    if config.advertise:
        hosts.append(split_address(config.advertise)[0] if ":" in config.advertise else config.advertise)
    return hosts, advertise_host


# The methods that keep a registered method in gRPC core (see ``_Registrar``): the agent's.
REGISTERED_METHODS = frozenset(f"/{wire.AGENT_SERVICE}/{method}" for method in wire.AGENT_METHODS)


class _Registrar:
    """What the generated ``add_*_to_server`` functions are given instead of the server: each
    service's handlers go in as its generic handler, as the generated code makes it, and only
    the methods in ``registered`` are registered with gRPC core as well.

    Why: grpc.aio's server loop keeps one request pending in gRPC core per registered method,
    plus one for all the others, and for every call it accepts waits on all of them again
    (``asyncio.wait``, a callback added to and removed from each). With the 40 methods of the
    agent, admin, health and reflection services registered, that is most of gRPC aio's own
    Python work per call: an echo server under callgrind took 539,000 instructions per unary
    call with 41 methods registered, 317,000 with its method in a generic handler; here, about
    0.2 M instructions came off each enrollment and each admin call. A method that is not
    registered is found in its service's generic handler (a dict lookup) and is the same handler
    object: the interceptors, status codes, unimplemented methods, metadata, deadlines and
    message limits are as before. Only the core queue it waits in while the server is busy
    changes: the agent's few methods keep one each, so a storm of agent calls does not queue
    in front of admin, health or reflection calls, nor Connect calls in front of Enroll calls.
    """

    def __init__(self, server: grpc.aio.Server, registered: Collection[str]) -> None:
        self._server = server
        self._registered = registered

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        kept = {name: h for name, h in handlers.items() if f"/{service}/{name}" in self._registered}
        if kept:
            self._server.add_registered_method_handlers(service, kept)


def _add_services(
    server: grpc.aio.Server, app: App, registered: Collection[str] = REGISTERED_METHODS
) -> tuple[health.aio.HealthServicer, AgentService]:
    """The agent and admin services, health and reflection, on ``server``: only the methods in
    ``registered`` registered with gRPC core, the others served by generic handlers."""
    target = cast(grpc.aio.Server, _Registrar(server, registered))  # has what the generated code calls
    agents = AgentService(app)
    app.rollouts.deliver = agents.push_plan
    wire.add_agent(agents, target)
    wire.add_admin(AdminService(app, agents), target)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, target)
    names = (*wire.SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME)
    # as reflection.enable_server_reflection does for a grpc.aio.Server (the registrar is not one)
    servicer = reflection.aio.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, target)
    return health_servicer, agents


async def _open_store(config: ControllerConfig) -> tuple[Store, StoreKey | None]:
    """``--store``: a PostgreSQL URL, or a SQLite file (default: DATA_DIR/tether.db, as always),
    and the key of ``--store-key-file``, loaded (or created: the first replica) before the store
    opens, since a PostgreSQL store signs its notices with it. The URL's password is masked in
    every log line from now on; a URL that does not parse is refused before the key file is made."""
    location = config.store or config.data_dir / "tether.db"
    if config.store:
        from tether.controller.store.migrations import is_postgres_url

        if is_postgres_url(config.store):
            from tether.controller.store.pgconn import check_url, passwords

            PROCESS_REDACTOR.add(*passwords(config.store))
            check_url(config.store)
    key = await load_store_key(config)
    store = await open_store(
        location, observe_commit=metrics.store_committed, notify_key=key.key if key is not None else None
    )
    return store, key


class Controller:
    """A running controller; ``start`` binds and writes admin.conf, ``wait`` blocks until stopped."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.server: grpc.aio.Server | None = None
        self.app: App | None = None
        self.address = ""
        self.metrics: metrics.MetricsListener | None = None
        self.replicas: replicas.Replicas | None = None
        self.delivery: delivery.Delivery | None = None

    async def start(self) -> App:
        """Check the address, then create what is missing; a failure leaves no new state behind."""
        config = self.config
        host, _ = preflight(config.listen)  # before anything exists on disk
        if config.metrics_listen:
            preflight(config.metrics_listen)
        created = not config.data_dir.exists()
        config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        store: Store | None = None
        try:
            store, key = await _open_store(config)
            identity = await load_identity(config, store, key)
            return await self._serve(identity, store, host)
        except BaseException:
            await self._undo_start(store, created)
            raise

    async def _undo_start(self, store: Store | None, created: bool) -> None:
        """After a failed start: stop what started, and remove a data dir this start created,
        unless it holds the key file of an identity now sealed in a shared database."""
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if self.replicas is not None:
            await self.replicas.stop()
            self.replicas = None
        if self.delivery is not None:
            await self.delivery.stop()
            self.delivery = None
        if store is not None:
            await store.close()
        if created and not _holds_shared_key(self.config, store):
            shutil.rmtree(self.config.data_dir, ignore_errors=True)

    def _bind(self, ca: CertificateAuthority, host: str) -> tuple[grpc.aio.Server, int, str]:
        """The server, bound: (server, port, the host agents are told)."""
        config = self.config
        hosts, advertise_host = _serving_names(config, host)
        try:
            key_pem, chain_pem = ca.server_credentials(hosts)
        except ValueError as exc:
            raise ListenError(
                f"invalid name for the serving certificate (--san, --advertise): {exc}"
            ) from None
        creds = grpc.ssl_server_credentials(
            [(key_pem, chain_pem)],
            root_certificates=ca.cert_pem + anonymous.CERT_PEM,
            require_client_auth=True,
        )
        server = grpc.aio.server(
            options=server_options(config.max_document_bytes),
            interceptors=[Guard(enroll=enroll_bucket(config))],
        )
        try:
            bound = server.add_secure_port(config.listen, creds)
        except RuntimeError:  # gRPC raises when it cannot bind (taken since the pre-flight)
            bound = 0
        if bound == 0:
            raise ListenError(f"cannot listen on {config.listen}")
        return server, bound, advertise_host

    async def _serve(self, identity: Identity, store: Store, host: str) -> App:
        config = self.config
        ca = identity.ca
        server, bound, advertise_host = self._bind(ca, host)
        self.address = _join_host(host, bound)
        advertise = config.advertise or _join_host(advertise_host, bound)
        hub = Hub()
        watch = NodeWatch(store, hub)  # the servicers write through watch.store: node changes are seen
        bundles = agent_bundles(config)
        planner = Planner(store, bundles=bundles)
        cluster = Orchestrator(store, hub, identity.box, PROCESS_REDACTOR, specs=planner.spec)
        admins = identity.admins  # revocations and scopes of admin certificates
        app = App(
            config=config,
            ca=ca,
            store=watch.store,
            auth=Authenticator(
                ca,
                revoked=admins.is_revoked,
                scope=admins.scope_of,
                recorded_only=admins.every_certificate_recorded,
            ),
            hub=hub,
            planner=planner,
            advertise=advertise,
            cluster=cluster,
            rollouts=RolloutDriver(store, hub, planner, cluster),
            gates=cluster,
            bundles=bundles,
            watch=watch,
        )
        app.hardware = HardwareGate(app.store, hub, cluster, spec_of=lambda node: _node_spec(app, node))
        app.drift = DriftWatch(app.store, hub, planner.spec, state=watch.state, cordoner=cluster)
        health_servicer, agents = _add_services(server, app)
        self.delivery = delivery.install(app, agents)  # several replicas: None with SQLite
        await watch.start()
        if self.delivery is not None:
            await self.delivery.start()
        await _parse_stored_specs(app)
        await _build_named_bundles(app)
        if config.metrics_listen:
            self.metrics = metrics.MetricsListener(config.metrics_listen, _db_path(store))
        # Registered among the replicas before serving; the leader (with SQLite: this one, at once)
        # resumes the rollouts the store holds and runs the other singleton work.
        self.replicas = app.replicas = await replicas.start(store, app, agents.resets, advertise)
        await server.start()
        app.progress.run(app.hub, app.store.get_node)  # flags stragglers (not revoked nodes)
        for name in ("", *wire.SERVICE_NAMES):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.metrics is not None:
            self.metrics.attach(app, asyncio.get_running_loop(), self.address)
            self.metrics.probes.serving = True
        admin_address = advertise if host in WILDCARDS else self.address
        await ensure_admin_conf(identity, config.data_dir / "admin.conf", admin_address)
        self.server, self.app = server, app
        log.info(
            "controller started",
            address=self.address,
            advertise=advertise,
            ca_hash=ca.ca_hash,
            data_dir=str(config.data_dir),
            store=store.kind,
            replica=store.replica_id,
        )
        return app

    async def stop(self, grace: float = 5.0) -> None:
        if self.metrics is not None:
            self.metrics.probes.serving = False  # /readyz fails while the calls drain
        if self.replicas is not None:
            await self.replicas.stop()  # the lead goes to another replica at once
        if self.app is not None:
            await self.app.rollouts.stop()
            await self.app.progress.stop()
        if self.server is not None:
            await self.server.stop(grace)
        if self.delivery is not None:
            await self.delivery.stop()  # this replica's streams are gone for the others at once
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.close)
        if self.app is not None:
            await self.app.store.close()

    async def wait(self) -> None:
        assert self.server is not None
        await self.server.wait_for_termination()


def _db_path(store: Store) -> Path | None:
    """The SQLite file the metrics listener reads; None for a PostgreSQL store (the listener
    counts from the store's in-memory view and asks the database through the store)."""
    path = getattr(store, "path", None)
    return path if store.kind == "sqlite" and isinstance(path, Path) else None


def _holds_shared_key(config: ControllerConfig, store: Store | None) -> bool:
    """Whether the data dir holds the --store-key-file of a database store: the identity sealed
    with it may already be in the database, and without the key nobody could open it again."""
    key = config.store_key_file
    if key is None or store is None or store.kind == "sqlite" or not key.exists():
        return False
    return key.resolve().is_relative_to(config.data_dir.resolve())


def _node_spec(app: App, node: NodeRecord) -> EnvironmentSpec | None:
    """The spec of the generation the node's plan comes from (the current one if that is gone)."""
    env = app.planner.revision(node.environment, node.plan_generation)
    env = env or app.store.get_environment(node.environment)
    return app.planner.spec(env).spec if env is not None else None


async def _parse_stored_specs(app: App) -> None:
    """Parse the stored environments in a worker thread now, so that no plan parses one on the loop."""
    for env in app.store.list_environments():
        try:
            loaded = await asyncio.to_thread(load_document, env.document)
        except Exception as exc:  # the planner reports it when a node of that environment asks
            log.warning(
                "stored environment does not load",
                environment=env.name,
                error=(str(exc).splitlines() or [type(exc).__name__])[0],
            )
            continue
        app.planner.remember(env, loaded)


async def _build_named_bundles(app: App) -> None:
    """Build the controller's own agent bundle now when an environment names its version (a plan
    rendered before it exists would carry no agent target)."""
    bundles = app.bundles
    if bundles is None:
        return
    if any(e.agent_version == bundles.own_version for e in app.store.list_environments()):
        try:
            await bundles.ensure(bundles.own_version)
        except ControllerError as exc:
            log.warning("agent bundle not available", version=bundles.own_version, error=str(exc))


async def serve(
    config: ControllerConfig,
    on_ready: Callable[[str], None] | None = None,
    on_metrics: Callable[[str], None] | None = None,
) -> None:
    controller = Controller(config)
    await controller.start()
    gc.freeze()  # what start-up built lives as long as the process: no collection walks it again
    gc.set_threshold(*GC_THRESHOLDS)
    if on_ready is not None:
        on_ready(controller.address)
    if on_metrics is not None and controller.metrics is not None:
        on_metrics(controller.metrics.address)
    # Under systemd (Type=notify): ready now, and WATCHDOG=1 pings from this loop (WatchdogSec).
    systemd.notify(f"READY=1\nSTATUS=listening on {controller.address}")
    watchdog = asyncio.ensure_future(_watchdog()) if systemd.watchdog_interval() else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    waiter = asyncio.ensure_future(controller.wait())
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    log.info("controller stopping")
    systemd.notify("STOPPING=1")
    await controller.stop()
    waiter.cancel()
    stopper.cancel()
    if watchdog is not None:
        watchdog.cancel()


async def _watchdog() -> None:
    """Ping systemd's watchdog while the event loop runs (a hung loop stops the pings)."""
    interval = systemd.watchdog_interval() or 10.0
    while True:
        systemd.notify("WATCHDOG=1")
        await asyncio.sleep(interval)
