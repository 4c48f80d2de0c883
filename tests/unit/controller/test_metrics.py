"""tether.controller.metrics: node states counted like nodestate, fleet gauges, the hot-path counters and
the HTTP listener (/metrics, /healthz, /readyz)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from tests.unit.controller.test_store import enroll
from tether.controller import metrics
from tether.controller.errors import InvalidArgument, NotFound, TokenRejected
from tether.controller.hub import Hub
from tether.controller.listen import ListenError
from tether.controller.nodestate import NodeState, node_state
from tether.controller.rollout.state import NodeProgress, NodeStage, Rollout, RolloutStatus
from tether.controller.rpc import unary
from tether.controller.spec.model import RolloutPolicy
from tether.controller.store import SqliteStore
from tether.nodeagent.model import Event, EventKind, Plan, Step

T = Any


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "t.db", observe_commit=metrics.store_committed)
    yield s
    await s.close()


# Each case: (steps as (state, continue_on_error); None: no plan yet).
STEP_CASES: list[list[tuple[str, bool]] | None] = [
    None,
    [],
    [("succeeded", False), ("skipped", False)],
    [("succeeded", False), ("pending", False)],
    [("failed", False), ("succeeded", False)],
    [("failed", True), ("succeeded", False)],
    [("retrying", False)],
    [("running", False), ("waiting", False)],
]
KIND = {
    "succeeded": EventKind.SUCCEEDED,
    "skipped": EventKind.SKIPPED,
    "failed": EventKind.FAILED,
    "running": EventKind.STARTED,
    "waiting": EventKind.WAITING,
}


async def fleet(store: SqliteStore) -> tuple[set[str], set[str]]:
    """Nodes for every (revoked, quarantined, connected, steps) case; returns (connected, revoked)."""
    connected, revoked = set(), set()
    i = 0
    for gone in (False, True):
        for held in (False, True):
            for online in (False, True):
                for case in STEP_CASES:
                    i += 1
                    name = f"n{i}"
                    await enroll(store, name)
                    if case is not None:
                        await _give_plan(store, name, case)
                    if gone:
                        await store.update_node(name, revoked=True)
                        revoked.add(name)
                    if held:  # the hardware gate's verdict (tether.controller.hardware)
                        await store.update_node(name, hardware={"quarantine": {"stage": "before-steps"}})
                    if online:
                        connected.add(name)
    return connected, revoked


async def _give_plan(store: SqliteStore, name: str, steps: list[tuple[str, bool]]) -> None:
    plan = Plan.build(
        [Step(name=f"s{j}", script="true", continue_on_error=coe) for j, (_, coe) in enumerate(steps)],
        generation=1,
        environment="e",
    )
    await store.set_node_plan(name, plan)
    events = []
    for j, ((state, _), step) in enumerate(zip(steps, plan.steps, strict=True)):
        if state == "retrying":
            events.append(
                Event(kind=EventKind.FAILED, step=step.name, digest=step.digest, seq=j + 1, will_retry=True)
            )
        elif state != "pending":
            events.append(Event(kind=KIND[state], step=step.name, digest=step.digest, seq=j + 1))
    if events:
        await store.append_events(name, events)


async def test_node_states_are_counted_as_nodestate_decides(store: SqliteStore) -> None:
    connected, _ = await fleet(store)
    expected = Counter(
        ("e", node_state(n, store.node_steps(n.name), n.name in connected).value) for n in store.list_nodes()
    )
    conn = metrics.read_only(store.path)
    try:
        got = metrics.node_state_counts(conn.execute(metrics.NODE_SCAN_SQL), frozenset(connected))
    finally:
        conn.close()
    assert got == expected
    assert {state for _, state in got} == {s.value for s in NodeState}  # every state is covered


class Rollouts:
    def __init__(self, *rollouts: Rollout) -> None:
        self.by_env = {r.environment: r for r in rollouts}

    def get(self, environment: str) -> Rollout | None:
        return self.by_env.get(environment)


def families(collector: metrics.FleetCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value for fam in collector.collect() for s in fam.samples
    }


async def app_with_fleet(store: SqliteStore) -> tuple[SimpleNamespace, set[str]]:
    connected, _ = await fleet(store)
    await store.put_environment("e", "doc", "tether/v1", {})
    await store.put_environment("empty", "doc", "tether/v1", {})
    hub = Hub()
    for name in connected:
        hub.attach(name, "e")
    rollout = Rollout(
        "e",
        3,
        2,
        RolloutPolicy(),
        status=RolloutStatus.PAUSED,
        nodes={"n1": NodeProgress(NodeStage.UPDATED, 2), "n2": NodeProgress(NodeStage.PENDING, 2)},
    )
    return SimpleNamespace(store=store, hub=hub, rollouts=Rollouts(rollout)), connected


def direct(fn: Callable[[], T]) -> T:
    return fn()


async def test_fleet_gauges(store: SqliteStore) -> None:
    app, connected = await app_with_fleet(store)
    collector = metrics.FleetCollector(app, direct, store.path, min_seconds=0)  # type: ignore[arg-type]
    got = families(collector)
    assert got[("tether_agents_connected", ())] == len(connected)
    provisioned = got[("tether_nodes", (("environment", "e"), ("state", "provisioned")))]
    assert provisioned == 3  # connected, not revoked: no steps, all done, failed but continue-on-error
    assert got[("tether_nodes", (("environment", "e"), ("state", "revoked")))] == 32
    assert got[("tether_nodes", (("environment", "e"), ("state", "quarantined")))] == 16  # not revoked
    assert got[("tether_nodes", (("environment", "empty"), ("state", "provisioned")))] == 0  # still a series
    assert got[("tether_rollout_state", (("environment", "e"), ("state", "paused")))] == 1
    assert got[("tether_rollout_state", (("environment", "e"), ("state", "progressing")))] == 0
    assert got[("tether_rollout_generation", (("environment", "e"),))] == 3
    assert got[("tether_rollout_nodes", (("environment", "e"), ("stage", "updated")))] == 1
    assert got[("tether_rollout_nodes", (("environment", "e"), ("stage", "failed")))] == 0
    assert not any(("node", n) in labels for (_, labels) in got for n in connected)  # no per-node label
    collector.close()


async def test_gpu_conditions_are_counted_by_environment_and_type(store: SqliteStore) -> None:
    app, _ = await app_with_fleet(store)
    held = {"reason": "FellOffTheBus", "message": "m", "since_ms": 1}
    await store.update_node("n1", hardware={"conditions": {"GPUsMissing": held, "GPUErrors": held}})
    await store.update_node(
        "n2", hardware={"quarantine": {"stage": "x"}, "conditions": {"GPUsMissing": held}}
    )
    await store.update_node("n3", hardware={"conditions": {"GPUErrors": held}}, revoked=True)  # not counted
    collector = metrics.FleetCollector(app, direct, store.path, min_seconds=0)  # type: ignore[arg-type]
    got = {k: v for k, v in families(collector).items() if k[0] == "tether_node_conditions"}
    assert got == {
        ("tether_node_conditions", (("environment", env), ("type", kind))): count
        for env, kind, count in (
            ("e", "GPUsMissing", 2),
            ("e", "GPUErrors", 1),
            ("e", "DriverMismatch", 0),
            ("empty", "GPUsMissing", 0),
            ("empty", "GPUErrors", 0),
            ("empty", "DriverMismatch", 0),
        )
    }
    collector.close()


async def test_one_count_serves_scrapes_for_min_seconds(store: SqliteStore) -> None:
    app, connected = await app_with_fleet(store)
    cached = metrics.FleetCollector(app, direct, store.path, min_seconds=3600)  # type: ignore[arg-type]
    fresh = metrics.FleetCollector(app, direct, store.path, min_seconds=0)  # type: ignore[arg-type]
    scan = ("tether_nodes_scan_duration_seconds", ())
    first = families(cached)
    assert {k: v for k, v in first.items() if k != scan} == {
        k: v for k, v in families(fresh).items() if k != scan
    }
    app.hub.detach(app.hub.session(sorted(connected)[0]))
    key = ("tether_agents_connected", ())
    assert families(cached) == first  # the same count, its time included
    assert families(fresh)[key] == len(connected) - 1
    cached.close()
    fresh.close()


async def test_a_silent_loop_leaves_the_fleet_gauges_out(store: SqliteStore) -> None:
    app, _ = await app_with_fleet(store)
    collector = metrics.FleetCollector(app, lambda fn: None, store.path, min_seconds=0)  # type: ignore[arg-type]
    assert list(collector.collect()) == []


def test_events_counted_and_finished_steps_timed() -> None:
    stored = sample("tether_events_stored_total")
    ok = dict(environment="gpu", step="driver", result="succeeded")
    bad = dict(ok, result="failed")
    before_ok = sample("tether_step_duration_seconds_count", **ok)
    before_bad = sample("tether_step_duration_seconds_count", **bad)
    sum_ok = sample("tether_step_duration_seconds_sum", **ok)
    metrics.events_stored(
        "gpu",
        [
            Event(kind=EventKind.STARTED, step="driver"),
            Event(kind=EventKind.OUTPUT, step="driver", lines=("x",)),
            Event(kind=EventKind.FAILED, step="driver", duration_seconds=3.0, will_retry=True),
            Event(kind=EventKind.SUCCEEDED, step="driver", duration_seconds=40.0),
            Event(kind=EventKind.INFO, message="hello"),
        ],
    )
    assert sample("tether_events_stored_total") == stored + 5
    assert sample("tether_step_duration_seconds_count", **ok) == before_ok + 1
    assert sample("tether_step_duration_seconds_count", **bad) == before_bad + 1
    assert sample("tether_step_duration_seconds_sum", **ok) == sum_ok + 40.0


def test_enrollment_results() -> None:
    before = {r: sample("tether_enrollments_total", result=r) for r in metrics.ENROLL_RESULTS}
    metrics.count_enrollment(None)
    metrics.count_enrollment(TokenRejected("expired", "the token has expired"))
    metrics.count_enrollment(InvalidArgument(["bad name"]))
    metrics.count_enrollment(RuntimeError("boom"))
    after = {r: sample("tether_enrollments_total", result=r) for r in metrics.ENROLL_RESULTS}
    assert {r: after[r] - before[r] for r in after} == {"enrolled": 1, "refused": 1, "invalid": 1, "error": 1}


class Aborted(Exception):
    pass


class Context:
    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)

    async def abort_with_status(self, status: grpc.Status) -> None:
        await self.abort(status.code, status.details)


class Service:
    @unary
    async def Fine(self, request: Any, context: Any) -> str:
        return "ok"

    @unary
    async def Missing(self, request: Any, context: Any) -> str:
        raise NotFound("nothing here")


async def test_unary_calls_are_timed_and_errors_counted_by_code() -> None:
    fine = sample("tether_rpc_duration_seconds_count", method="Fine")
    missing = sample("tether_rpc_duration_seconds_count", method="Missing")
    errors = sample("tether_rpc_errors_total", method="Missing", code="NOT_FOUND")
    assert await Service().Fine(None, Context()) == "ok"
    with pytest.raises(Aborted):
        await Service().Missing(None, Context())
    assert sample("tether_rpc_duration_seconds_count", method="Fine") == fine + 1
    assert sample("tether_rpc_duration_seconds_count", method="Missing") == missing + 1
    assert sample("tether_rpc_errors_total", method="Missing", code="NOT_FOUND") == errors + 1
    assert sample("tether_rpc_errors_total", method="Fine", code="NOT_FOUND") == 0


async def test_store_commits_are_timed(store: SqliteStore) -> None:
    commits, writes = (
        sample("tether_store_commit_duration_seconds_count"),
        sample("tether_store_writes_total"),
    )
    await asyncio.gather(*(store.kv_put(f"k{i}", b"v") for i in range(10)))
    assert sample("tether_store_writes_total") == writes + 10
    assert commits + 1 <= sample("tether_store_commit_duration_seconds_count") <= commits + 10


# -- the listener ----------------------------------------------------------------------------


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


@pytest.fixture
async def listening(store: SqliteStore) -> AsyncIterator[tuple[metrics.MetricsListener, socket.socket]]:
    app, _ = await app_with_fleet(store)
    grpc_port = socket.create_server(("127.0.0.1", 0))  # stands in for the gRPC port
    listener = metrics.MetricsListener("127.0.0.1:0", store.path)
    listener.attach(app, asyncio.get_running_loop(), f"127.0.0.1:{grpc_port.getsockname()[1]}")  # type: ignore[arg-type]
    yield listener, grpc_port
    await asyncio.to_thread(listener.close)
    grpc_port.close()


async def test_metrics_endpoint(listening: tuple[metrics.MetricsListener, socket.socket]) -> None:
    listener, _ = listening
    status, kind, body = await asyncio.to_thread(get, f"http://{listener.address}/metrics")
    assert status == 200 and kind.startswith("text/plain")
    for name in (
        "tether_agents_connected 32.0",
        'tether_nodes{environment="e",state="offline"} 8.0',
        'tether_enrollments_total{result="enrolled"}',
        "tether_events_stored_total",
        "# TYPE tether_step_duration_seconds histogram",
        "# TYPE tether_rpc_duration_seconds histogram",
        "tether_store_commit_duration_seconds_bucket",
        'tether_rollout_state{environment="e",state="paused"} 1.0',
        'tether_build_info{version="',
        "process_resident_memory_bytes",
    ):
        assert name in body
    assert "_created" not in body


async def test_health_and_readiness(listening: tuple[metrics.MetricsListener, socket.socket]) -> None:
    listener, grpc_port = listening
    base = f"http://{listener.address}"
    assert await asyncio.to_thread(get, f"{base}/healthz") == (
        200,
        "text/plain; charset=utf-8",
        "ok event loop\n",
    )
    status, _, body = await asyncio.to_thread(get, f"{base}/readyz")
    assert status == 503 and "FAIL grpc: not serving" in body and "ok store" in body
    listener.probes.serving = True
    status, _, body = await asyncio.to_thread(get, f"{base}/readyz")
    assert status == 200 and "FAIL" not in body, body
    grpc_port.close()
    status, _, body = await asyncio.to_thread(get, f"{base}/readyz")
    assert status == 503 and "does not accept connections" in body
    assert (await asyncio.to_thread(get, f"{base}/other"))[0] == 404


async def test_readiness_needs_the_store(listening: tuple[metrics.MetricsListener, socket.socket]) -> None:
    listener, _ = listening
    listener.probes.serving = True
    listener.probes.db_path = listener.db_path.with_name("gone.db")
    status, _, body = await asyncio.to_thread(get, f"http://{listener.address}/readyz")
    assert status == 503 and "FAIL store" in body


async def test_a_stalled_loop_fails_the_health_probe(
    listening: tuple[metrics.MetricsListener, socket.socket],
) -> None:
    listener, _ = listening
    url = f"http://{listener.address}/healthz"
    probe = asyncio.get_running_loop().run_in_executor(None, get, url)
    time.sleep(metrics.METRICS_PROBE_SECONDS + 0.5)  # the loop is held: it cannot answer the probe
    status, _, body = await probe
    assert status == 503 and "event loop" in body


def test_a_taken_port_is_one_line(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(ListenError, match=f"cannot listen on {address} for metrics"):
            metrics.MetricsListener(address, tmp_path / "t.db")


# -- the Grafana dashboard -------------------------------------------------------------------

DASHBOARD = Path(__file__).parents[3] / "packaging" / "grafana" / "tether.json"


def exported_names() -> set[str]:
    """Every series name the controller's /metrics and the agent's textfile can hold."""
    from tether.nodeagent.textfile import AgentFigures, render

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    names = {f"{fam.name}{x}" for fam in metrics.REGISTRY.collect() for x in suffixes.get(fam.type, ("",))}
    names |= {"tether_agents_connected", "tether_nodes", "tether_nodes_scan_duration_seconds"}
    names |= {"tether_node_conditions", "tether_replica_leader", "tether_replicas_live"}
    names |= {"tether_rollout_state", "tether_rollout_generation", "tether_rollout_nodes"}
    names |= {line.split()[2] for line in render(AgentFigures("1")).splitlines() if line.startswith("# TYPE")}
    return names


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in doc["panels"] for t in p.get("targets", ())]


def test_the_dashboard_uses_only_exported_names() -> None:
    exprs = dashboard_exprs()
    used = {n for e in exprs for n in re.findall(r"\b((?:tether|process)_[a-z_]+)\b", e)}
    assert len(exprs) > 20 and used
    assert used - exported_names() == set()
    for name in ("tether_agents_connected", "tether_nodes", "tether_step_duration_seconds_bucket"):
        assert name in used


def test_the_dashboard_queries_are_promql(tmp_path: Path) -> None:
    from tests.unit.nodeagent.test_textfile import promtool

    exe = promtool()
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {
                        "record": f"dashboard:q{i}",
                        "expr": e.replace("$__rate_interval", "5m").replace("$", ""),
                    }
                    for i, e in enumerate(dashboard_exprs())
                ],
            }
        ]
    }
    path = tmp_path / "rules.yaml"
    path.write_text(json.dumps(rules))
    out = subprocess.run([exe, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
