"""Prometheus metrics and plain-HTTP health probes (``tether-controller serve --metrics-listen``).

The counters and histograms below are module-level and cost a lock and an add where they are
updated (enrollment, event batches, finished steps, unary RPCs, store commits). Fleet gauges
(agents connected, nodes by environment and state, rollouts, this replica's lead) are computed
when scraped, in the listener's thread, at most once every ``METRICS_SCAN_MIN_SECONDS``:

- SQLite: the nodes from a read-only connection of their own (one aggregate query), the
  in-memory parts from a snapshot that the event loop hands over in one short turn;
- PostgreSQL (no file to read; the store answers from its in-memory view): the loop hands over
  its node records, then, ``VIEW_SLICE_NODES`` at a time (one short turn each), whether each is
  connected (here or on another replica, as ``Hub.connected`` says) and the steps of those whose
  steps decide their state; the listener's thread counts them (``nodestate.node_state``).

Nothing here runs long on the loop, and no label names a node. ``/healthz`` says the event loop
answers; ``/readyz`` that the controller serves gRPC, its port accepts connections and its store
answers (SQLite: the file can be read; PostgreSQL: a query through the store, bounded), and with
PostgreSQL which replica leads (a line for operators, never a failure).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import socket
import socketserver
import sqlite3
import threading
import time
from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    make_wsgi_app,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tether.controller import __version__
from tether.controller.errors import (
    AlreadyExists,
    ControllerError,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    TokenRejected,
)
from tether.controller.hardware.names import CONDITION_TYPES
from tether.controller.limits import (
    METRICS_PROBE_SECONDS,
    METRICS_REQUEST_TIMEOUT_SECONDS,
    METRICS_SCAN_MIN_SECONDS,
)
from tether.controller.listen import WILDCARDS, ListenError, parse
from tether.controller.nodestate import NodeState, node_state
from tether.controller.rollout.state import NodeStage, RolloutStatus
from tether.controller.store.records import NodeRecord, StepRecord
from tether.nodeagent import logs
from tether.nodeagent.model import Event, EventKind

if TYPE_CHECKING:
    from tether.controller.app import App

log = logs.get_logger("tether.controller.metrics")
T = TypeVar("T")


class OnLoop(Protocol):
    """Runs a function on the controller's event loop; None when the loop does not answer in time."""

    def __call__(self, fn: Callable[[], T]) -> T | None: ...


class AwaitOnLoop(Protocol):
    """Awaits ``fn()`` on the controller's event loop for at most ``timeout`` seconds; None when it
    does not finish in time (or the loop is gone). What ``fn`` raises, it raises."""

    def __call__(self, fn: Callable[[], Awaitable[T]], timeout: float) -> T | None: ...


# No ``*_created`` series next to every counter and histogram.
disable_created_metrics()  # type: ignore[no-untyped-call]

REGISTRY = CollectorRegistry()
for _standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_standard)

ENROLL_RESULTS = ("enrolled", "refused", "invalid", "error")
ENROLLMENTS = Counter(
    "tether_enrollments",
    "Enroll calls by result: enrolled, refused (token, name or rate), invalid (request), error.",
    ["result"],
    registry=REGISTRY,
)
EVENTS_STORED = Counter("tether_events_stored", "Node events stored (after quotas).", registry=REGISTRY)
STEP_SECONDS = Histogram(
    "tether_step_duration_seconds",
    "Duration of each finished step attempt, as the agent measured it.",
    ["environment", "step", "result"],
    buckets=(1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600),
    registry=REGISTRY,
)
RPC_SECONDS = Histogram(
    "tether_rpc_duration_seconds",
    "Time to answer a unary gRPC call, by method (errors included).",
    ["method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
RPC_ERRORS = Counter(
    "tether_rpc_errors",
    "Unary gRPC calls that ended in an error, by method and status code.",
    ["method", "code"],
    registry=REGISTRY,
)
STORE_COMMIT_SECONDS = Histogram(
    "tether_store_commit_duration_seconds",
    "Time of one group commit of the store (every write queued meanwhile, one fsync).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
    registry=REGISTRY,
)
STORE_WRITES = Counter("tether_store_writes", "Writes committed to the store.", registry=REGISTRY)
BUILD_INFO = Gauge(
    "tether_build_info", "The controller's version (always 1).", ["version"], registry=REGISTRY
)
BUILD_INFO.labels(__version__).set(1)
for _result in ENROLL_RESULTS:
    ENROLLMENTS.labels(_result)
QUARANTINES = Counter(
    "tether_quarantines",
    "Nodes quarantined by the hardware gate, by environment and stage (before-steps, before-join, "
    "diagnostics).",
    ["environment", "stage"],
    registry=REGISTRY,
)
RELEASES = Counter(
    "tether_quarantine_releases",
    "Quarantined nodes an operator let go on (tetherctl node release), by environment.",
    ["environment"],
    registry=REGISTRY,
)
STRAGGLERS = Gauge(
    "tether_stragglers",
    "Nodes whose current step has run more than 3x the median of the same step on other nodes, "
    "and at least 10 s longer, by environment (environments with a step running).",
    ["environment"],
    registry=REGISTRY,
)
_straggler_environments: set[str] = set()

# Per node: revoked, has a plan, steps that fail it, steps not done (as tether.controller.nodestate decides).
NODE_SCAN_SQL = """
SELECT n.name, n.environment, n.revoked, n.plan_digest != '',
       COALESCE(s.blocking, 0), COALESCE(s.undone, 0),
       json_extract(n.hardware, '$.quarantine') IS NOT NULL
FROM nodes n LEFT JOIN (
    SELECT node,
           SUM(state = 'failed' AND continue_on_error = 0) AS blocking,
           SUM(NOT (state IN ('succeeded', 'skipped') OR (state = 'failed' AND continue_on_error = 1)))
               AS undone
    FROM node_steps GROUP BY node) s ON s.node = n.name
"""

# (environment, condition type, nodes): the GPU conditions that hold (tether.controller.hardware.drift).
# The view-based count (``view_condition_counts``) counts the same.
CONDITION_SCAN_SQL = """
SELECT n.environment, c.key, COUNT(*)
FROM nodes n, json_each(n.hardware, '$.conditions') c
WHERE n.revoked = 0 GROUP BY n.environment, c.key
"""


def count_enrollment(exc: BaseException | None) -> None:
    """Count one Enroll call: ``exc`` is what refused it (None: enrolled)."""
    if exc is None:
        result = "enrolled"
    elif isinstance(exc, (TokenRejected, AlreadyExists, ResourceExhausted, PermissionDenied)):
        result = "refused"
    elif isinstance(exc, InvalidArgument):
        result = "invalid"
    else:
        result = "error"
    ENROLLMENTS.labels(result).inc()


def events_stored(environment: str, events: Sequence[Event]) -> None:
    """Count a stored batch; its finished step attempts go to the step histogram."""
    EVENTS_STORED.inc(len(events))
    for e in events:
        if (e.kind is EventKind.SUCCEEDED or e.kind is EventKind.FAILED) and e.step:
            result = "succeeded" if e.kind is EventKind.SUCCEEDED else "failed"
            STEP_SECONDS.labels(environment, e.step, result).observe(e.duration_seconds)


def quarantined(environment: str, stage: str) -> None:
    QUARANTINES.labels(environment, stage).inc()


def released(environment: str) -> None:
    RELEASES.labels(environment).inc()


def stragglers(counts: dict[str, int]) -> None:
    """The straggler gauge (``tether.controller.progress``): these environments, no others."""
    for environment in _straggler_environments - counts.keys():
        STRAGGLERS.remove(environment)
    for environment, n in counts.items():
        STRAGGLERS.labels(environment).set(n)
    _straggler_environments.clear()
    _straggler_environments.update(counts)


def store_committed(seconds: float, writes: int) -> None:
    """One group commit of the store (called in its writer thread)."""
    STORE_COMMIT_SECONDS.observe(seconds)
    STORE_WRITES.inc(writes)


def timed_method(name: str) -> tuple[Callable[[float], None], Callable[[str], None]]:
    """(observe the duration, count an error by status code name) for the unary method ``name``."""
    seconds = RPC_SECONDS.labels(name)

    def error(code: str) -> None:
        RPC_ERRORS.labels(name, code).inc()

    return seconds.observe, error


def node_state_counts(rows: Iterable[tuple[Any, ...]], connected: frozenset[str]) -> Tally[tuple[str, str]]:
    """(environment, state) -> nodes, from ``NODE_SCAN_SQL`` rows (``node_state``'s rules)."""
    counts: Tally[tuple[str, str]] = Tally()
    for name, environment, revoked, planned, blocking, undone, quarantined in rows:
        if revoked:
            state = NodeState.REVOKED
        elif quarantined:
            state = NodeState.QUARANTINED
        elif name not in connected:
            state = NodeState.OFFLINE
        elif not planned:
            state = NodeState.PROVISIONING
        elif blocking:
            state = NodeState.FAILED
        elif not undone:
            state = NodeState.PROVISIONED
        else:
            state = NodeState.PROVISIONING
        counts[(environment, state.value)] += 1
    return counts


# -- counting from the store's in-memory view (PostgreSQL) -----------------------------------------

VIEW_SLICE_NODES = 1000  # nodes looked at in one turn of the event loop (about 1-3 ms for 1000)

# A node as the loop saw it: its record, whether its stream is open (here or on another replica),
# and its steps where they decide its state (else empty).
Seen = tuple[NodeRecord, bool, Sequence[StepRecord]]


def _quarantined(node: NodeRecord) -> bool:
    return bool(node.hardware.get("quarantine"))


class StepReader(Protocol):
    def node_steps(self, name: str) -> list[StepRecord]: ...


def seen_on_loop(
    store: StepReader, connected: Callable[[str], bool], records: Sequence[NodeRecord]
) -> list[Seen]:
    """What the loop hands over for ``records`` (run on the loop: ``connected`` is ``Hub.connected``
    and the steps are read from the store's view). Steps are read only where ``node_state`` looks
    at them: connected, planned, neither revoked nor quarantined."""
    out: list[Seen] = []
    for node in records:
        if node.revoked or _quarantined(node):
            out.append((node, False, ()))  # its state says so whatever its stream
            continue
        up = connected(node.name)
        out.append((node, up, store.node_steps(node.name) if up and node.plan_digest else ()))
    return out


def view_state_counts(seen: Iterable[Seen]) -> Tally[tuple[str, str]]:
    """(environment, state) -> nodes, as ``nodestate.node_state`` decides (any thread)."""
    counts: Tally[tuple[str, str]] = Tally()
    for node, up, steps in seen:
        counts[(node.environment, node_state(node, steps, up).value)] += 1
    return counts


def view_condition_counts(records: Iterable[NodeRecord]) -> Tally[tuple[str, str]]:
    """(environment, GPU condition type) -> nodes not revoked on which it holds (any thread)."""
    counts: Tally[tuple[str, str]] = Tally()
    for node in records:
        held = node.hardware.get("conditions") if not node.revoked else None
        if isinstance(held, dict):
            for kind in held:
                counts[(node.environment, str(kind))] += 1
    return counts


@dataclass(frozen=True)
class RolloutView:
    environment: str
    status: RolloutStatus
    generation: int
    stages: dict[NodeStage, int]


@dataclass(frozen=True)
class LoopView:
    """What the event loop owns, copied in one turn of it."""

    connected: frozenset[str]  # the nodes streaming to this replica
    rollouts: tuple[RolloutView, ...]
    environments: tuple[str, ...] = ()
    leader: bool | None = None  # this replica holds the singleton lease (None: not known yet)
    replicas_live: int | None = None  # live replicas in the registry (this one included)
    records: tuple[NodeRecord, ...] = ()  # every node (only when counted from the view)


def loop_view(app: App, records: bool = False) -> LoopView:
    """The connected nodes, the environments and their latest rollouts, this replica's lead and the
    live replicas; ``records``: every node's record too (run on the loop)."""
    rollouts = []
    environments = app.store.list_environments()
    for env in environments:
        r = app.rollouts.get(env.name)
        if r is not None:
            stages = Tally(p.stage for p in r.nodes.values())
            rollouts.append(RolloutView(env.name, r.status, r.generation, dict(stages)))
    connected = frozenset(s.node for s in app.hub.sessions())
    leader, live = None, None
    replicas = getattr(app, "replicas", None)
    if replicas is not None:
        leader = bool(replicas.leader.held)
        registry = replicas.registry  # (SQLite: one process, and no read of the file on the loop)
        live = sum(1 for r in registry.replicas() if registry.live(r)) if replicas.shared else 1
    return LoopView(
        connected,
        tuple(rollouts),
        tuple(e.name for e in environments),
        leader,
        live,
        tuple(app.store.list_nodes()) if records else (),
    )


def leader_line(app: App) -> str:
    """``/readyz``'s word on the singleton lease (run on the loop; informational, never a failure)."""
    replicas = getattr(app, "replicas", None)
    if replicas is None:
        return "info leader: not known yet (starting)"
    if replicas.leader.held:
        return "info leader: this replica leads (rollouts and reset deadlines run here)"
    others = [r for r in replicas.registry.replicas() if replicas.registry.leading(r)]
    if others:
        return f"info leader: not this replica; {others[0].address or others[0].id} leads"
    return "info leader: not this replica; none leads now (the lease is moving or the store is away)"


def read_only(db_path: Path) -> sqlite3.Connection:
    """A connection that can only read ``db_path`` (which must exist)."""
    conn = sqlite3.connect(
        f"{db_path.absolute().as_uri()}?mode=ro", uri=True, check_same_thread=False, timeout=2
    )
    conn.execute("PRAGMA query_only=ON")
    return conn


@dataclass
class FleetCollector(Collector):
    """The scrape-time gauges; one computation serves every scrape for ``min_seconds``.
    ``db_path`` None: the store is not SQLite, nodes are counted from its in-memory view."""

    app: App
    on_loop: OnLoop
    db_path: Path | None
    min_seconds: float = METRICS_SCAN_MIN_SECONDS
    slice_nodes: int = VIEW_SLICE_NODES
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _conn: sqlite3.Connection | None = None
    _at: float = -1e9
    _families: list[Metric] = field(default_factory=list)

    def describe(self) -> list[Metric]:
        return []  # the registry must not scrape at registration

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            if time.monotonic() - self._at >= self.min_seconds:
                self._families = self._compute()
                self._at = time.monotonic()
            return iter(list(self._families))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _compute(self) -> list[Metric]:
        from_view = self.db_path is None
        started = time.monotonic()
        view = self.on_loop(lambda: loop_view(self.app, records=from_view))
        if view is None:
            log.warning("metrics: the event loop did not answer; fleet gauges left out of this scrape")
            return []
        if self.db_path is None:
            seen = self._seen(view.records)
            if seen is None:
                log.warning("metrics: the event loop did not answer; fleet gauges left out of this scrape")
                return []
            counts = view_state_counts(seen)
            held = view_condition_counts(view.records)
            condition_rows: Iterable[tuple[Any, ...]] = [(e, k, n) for (e, k), n in held.items()]
        else:
            started = time.monotonic()  # the SQLite count alone, as before
            if self._conn is None:
                self._conn = read_only(self.db_path)
            counts = node_state_counts(self._conn.execute(NODE_SCAN_SQL), view.connected)
            condition_rows = self._conn.execute(CONDITION_SCAN_SQL).fetchall()
        scan = GaugeMetricFamily(
            "tether_nodes_scan_duration_seconds", "Time the last count of nodes by state took."
        )
        scan.add_metric([], time.monotonic() - started)
        agents = GaugeMetricFamily("tether_agents_connected", "Agents with an open stream to this replica.")
        agents.add_metric([], len(view.connected))
        nodes = _nodes_family(counts, view.environments)
        conditions = _conditions_family(condition_rows, view.environments)
        return [agents, nodes, conditions, *_rollout_families(view.rollouts), *_replica_families(view), scan]

    def _seen(self, records: Sequence[NodeRecord]) -> list[Seen] | None:
        """Every node as the loop sees it, ``slice_nodes`` per turn of the loop; None when the
        loop does not answer."""
        app, out = self.app, []
        for i in range(0, len(records), max(1, self.slice_nodes)):
            part = records[i : i + self.slice_nodes]
            seen = self.on_loop(functools.partial(seen_on_loop, app.store, app.hub.connected, part))
            if seen is None:
                return None
            out.extend(seen)
        return out


def _nodes_family(counts: Tally[tuple[str, str]], environments: Iterable[str]) -> GaugeMetricFamily:
    """Every state of every environment (zeros included: an empty environment has its series)."""
    nodes = GaugeMetricFamily(
        "tether_nodes",
        "Nodes by environment and state (as tetherctl shows them).",
        labels=["environment", "state"],
    )
    for environment in sorted({env for env, _ in counts} | set(environments)):
        for state in NodeState:
            nodes.add_metric([environment, state.value], counts[(environment, state.value)])
    return nodes


def _conditions_family(rows: Iterable[tuple[Any, ...]], environments: Iterable[str]) -> GaugeMetricFamily:
    """Nodes with each GPU condition, by environment (every type of every environment, zeros too)."""
    family = GaugeMetricFamily(
        "tether_node_conditions",
        "Nodes on which a GPU condition holds (GPUsMissing, GPUErrors, DriverMismatch), by environment.",
        labels=["environment", "type"],
    )
    counts = {(str(env), str(kind)): int(n) for env, kind, n in rows}
    for environment in sorted({env for env, _ in counts} | set(environments)):
        for kind in sorted(set(CONDITION_TYPES) | {k for e, k in counts if e == environment}):
            family.add_metric([environment, kind], counts.get((environment, kind), 0))
    return family


def _replica_families(view: LoopView) -> list[GaugeMetricFamily]:
    """This replica's lead and the live replicas (left out until the replicas are known)."""
    if view.leader is None or view.replicas_live is None:
        return []
    leader = GaugeMetricFamily(
        "tether_replica_leader",
        "1 while this replica holds the singleton lease (runs rollouts and reset deadlines), else 0.",
    )
    leader.add_metric([], 1 if view.leader else 0)
    live = GaugeMetricFamily(
        "tether_replicas_live", "Controller replicas live in the replica registry (this one included)."
    )
    live.add_metric([], view.replicas_live)
    return [leader, live]


def _rollout_families(rollouts: Iterable[RolloutView]) -> list[GaugeMetricFamily]:
    state = GaugeMetricFamily(
        "tether_rollout_state",
        "1 for the state the environment's latest rollout is in, 0 for the others.",
        labels=["environment", "state"],
    )
    generation = GaugeMetricFamily(
        "tether_rollout_generation", "The generation the latest rollout moves to.", labels=["environment"]
    )
    nodes = GaugeMetricFamily(
        "tether_rollout_nodes", "Nodes of the latest rollout by stage.", labels=["environment", "stage"]
    )
    for r in rollouts:
        for status in RolloutStatus:
            state.add_metric([r.environment, status.value], 1 if status is r.status else 0)
        generation.add_metric([r.environment], r.generation)
        for stage in NodeStage:
            nodes.add_metric([r.environment, stage.value], r.stages.get(stage, 0))
    return [state, generation, nodes]


class _Everything(Collector):
    """The module's registry and one controller's fleet gauges, as one registry's content."""

    def __init__(self, fleet: Collector | None) -> None:
        self.fleet = fleet

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()
        if self.fleet is not None:
            yield from self.fleet.collect()


@dataclass
class Probes:
    """The answers of ``/healthz`` and ``/readyz``: (healthy, one line per check). ``db_path``
    None: the store is not SQLite; ``app`` and ``await_on_loop`` ask it (``attach`` sets them)."""

    on_loop: OnLoop
    db_path: Path | None
    grpc_address: str = ""
    serving: bool = False
    app: App | None = None
    await_on_loop: AwaitOnLoop | None = None

    def healthz(self) -> tuple[bool, str]:
        if self.on_loop(lambda: True) is None:
            return False, f"FAIL event loop: no answer within {METRICS_PROBE_SECONDS:g}s"
        return True, "ok event loop"

    def readyz(self) -> tuple[bool, str]:
        checks = [self._serving(), self._store()]
        if self.db_path is None:
            checks.append((True, self._leader()))  # informational: never fails the probe
        checks += [self._port(), self.healthz()]
        return all(ok for ok, _ in checks), "\n".join(line for _, line in checks)

    def _serving(self) -> tuple[bool, str]:
        if not self.serving:
            return False, "FAIL grpc: not serving (starting or stopping)"
        return True, "ok serving"

    def _store(self) -> tuple[bool, str]:
        if self.db_path is None:
            return self._database()
        try:
            conn = read_only(self.db_path)
            try:
                conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            finally:
                conn.close()
        except sqlite3.Error as exc:
            return False, f"FAIL store: {exc}"
        return True, "ok store"

    def _database(self) -> tuple[bool, str]:
        """A quick query through the store (its connection pool), on the loop, bounded in time."""
        app, run = self.app, self.await_on_loop
        if app is None or run is None:
            return False, "FAIL store: not open yet"
        store = app.store
        wait = METRICS_PROBE_SECONDS

        async def ask() -> str:
            try:
                await asyncio.wait_for(store.list_audit(limit=1), wait)
            except TimeoutError:  # (the same class as the thread's own wait's: told apart here)
                return "slow"
            return "ok"

        try:
            answer = run(ask, wait + 1.0)
        except Exception as exc:  # StoreError: "store unavailable: ..."; anything else, in one line
            text = " ".join(str(exc).split()) or type(exc).__name__
            return False, f"FAIL store: {text}"
        if answer == "slow":
            return False, f"FAIL store: store unavailable: no answer within {wait:g}s"
        if answer is None:
            return False, f"FAIL store: no answer within {wait + 1.0:g}s (the event loop is busy)"
        return True, "ok store"

    def _leader(self) -> str:
        app = self.app
        if app is None:
            return "info leader: not known yet (starting)"
        line = self.on_loop(lambda: leader_line(app))
        return line if line is not None else "info leader: not known (the event loop did not answer)"

    def _port(self) -> tuple[bool, str]:
        if not self.grpc_address:
            return False, "FAIL grpc: no address yet"
        host, port = parse(self.grpc_address)
        if host in WILDCARDS:
            host = "::1" if ":" in host else "127.0.0.1"
        try:
            socket.create_connection((host, port), timeout=METRICS_PROBE_SECONDS).close()
        except OSError as exc:
            return (
                False,
                f"FAIL grpc: {self.grpc_address} does not accept connections ({exc.strerror or exc})",
            )
        return True, f"ok grpc {self.grpc_address}"


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    """A thread per request; no reverse lookup of its own name when it binds."""

    daemon_threads = True
    allow_reuse_address = True

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks the host's name up (a DNS query that can hang): not needed.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    timeout = METRICS_REQUEST_TIMEOUT_SECONDS  # a client that sends nothing lets go of its thread

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _text(start_response: Callable[..., Any], ok: bool, text: str) -> list[bytes]:
    body = (text + "\n").encode()
    start_response(
        "200 OK" if ok else "503 Service Unavailable",
        [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
        ],
    )
    return [body]


class MetricsListener:
    """``/metrics``, ``/healthz`` and ``/readyz`` over plain HTTP, served by threads of its own.

    Bound when made (so a taken port fails the start-up), serving once ``attach`` gave it the app.
    """

    def __init__(self, address: str, db_path: Path | None) -> None:
        host, port = parse(address)
        self.db_path = db_path
        self.loop: asyncio.AbstractEventLoop | None = None
        self.probes = Probes(self._on_loop, db_path)
        self.fleet: FleetCollector | None = None
        registry = CollectorRegistry()
        self._everything = _Everything(None)
        registry.register(self._everything)
        self._metrics_app = make_wsgi_app(registry)
        server_class = _Server6 if ":" in host else _Server
        try:
            self._server = make_server(
                host, port, self._route, server_class=server_class, handler_class=_QuietHandler
            )
        except OSError as exc:
            raise ListenError(f"cannot listen on {address} for metrics: {exc.strerror or exc}") from None
        bound = self._server.server_address[1]
        self.address = f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)

    def attach(self, app: App, loop: asyncio.AbstractEventLoop, grpc_address: str) -> None:
        """Start serving ``app``'s figures; the probes look at ``grpc_address``."""
        self.loop = loop
        self.fleet = FleetCollector(app, self._on_loop, self.db_path)
        self._everything.fleet = self.fleet
        self.probes.grpc_address = grpc_address
        self.probes.app = app
        self.probes.await_on_loop = self._await_on_loop
        self._thread.start()

    def close(self) -> None:
        self.probes.serving = False
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
        if self.fleet is not None:
            self.fleet.close()

    def _on_loop(self, fn: Callable[[], T]) -> T | None:
        """``fn()`` run on the controller's event loop; None when it does not answer in time."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return None

        async def call() -> T:
            return fn()

        try:
            future = asyncio.run_coroutine_threadsafe(call(), loop)
        except RuntimeError:  # the loop is shutting down
            return None
        try:
            return future.result(METRICS_PROBE_SECONDS)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return None

    def _await_on_loop(self, fn: Callable[[], Awaitable[T]], timeout: float) -> T | None:
        """``await fn()`` on the controller's event loop; None when it does not end in ``timeout``
        seconds (it is cancelled then). What it raises is raised here."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return None

        async def call() -> T:
            return await fn()

        coro = call()
        try:
            future = asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:  # the loop is shutting down
            coro.close()
            return None
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return None

    def _route(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        try:
            if path == "/metrics":
                return self._metrics_app(environ, start_response)  # type: ignore[no-any-return]
            if path == "/healthz":
                return _text(start_response, *self.probes.healthz())
            if path == "/readyz":
                return _text(start_response, *self.probes.readyz())
        except (ControllerError, sqlite3.Error) as exc:
            log.warning("metrics request failed", path=path, error=str(exc))
            return _text(start_response, False, f"FAIL {exc}")
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found: /metrics, /healthz and /readyz are served here\n"]
