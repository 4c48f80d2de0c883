"""tether.controller.metrics on a store without a file (PostgreSQL): fleet gauges counted from the
store's in-memory view in slices handed over by the event loop, nodes streaming to another replica
counted as connected, this replica's lead and the live replicas, and /readyz asking the database
through the store (a line on the lead, never a failure)."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.unit.controller.replica_fakes import Bus, Replica, replica
from tests.unit.controller.test_delivery import apply, streaming, wait_for
from tests.unit.controller.test_metrics import app_with_fleet, direct, families, fleet
from tether.controller import metrics
from tether.controller.errors import StoreError
from tether.controller.nodestate import node_state
from tether.controller.replicas.registry import PREFIX as REPLICA_PREFIX
from tether.controller.replicas.registry import Registry
from tether.controller.replicas.registry import Replica as Entry
from tether.controller.store import SqliteStore
from tether.nodeagent.model import now_ms

T = Any
SCAN = "tether_nodes_scan_duration_seconds"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "t.db")
    yield s
    await s.close()


class Counting:
    """An ``OnLoop`` that runs each function at once and counts the calls; from call ``fail_at``
    on (1-based) it answers None, as a loop that stopped answering does."""

    def __init__(self, fail_at: int = 0) -> None:
        self.calls = 0
        self.fail_at = fail_at

    def __call__(self, fn: Callable[[], T]) -> T | None:
        self.calls += 1
        if self.fail_at and self.calls >= self.fail_at:
            return None
        return fn()


def without_scan(got: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[Any, float]:
    return {k: v for k, v in got.items() if k[0] != SCAN}


async def test_view_counts_are_nodestate_and_equal_the_sqlite_count(store: SqliteStore) -> None:
    connected, _ = await fleet(store)
    held = {"reason": "r", "message": "m", "since_ms": 1}
    await store.update_node("n2", hardware={"conditions": {"GPUsMissing": held, "GPUErrors": held}})
    await store.update_node("n3", hardware={"quarantine": {"stage": "x"}, "conditions": {"GPUErrors": held}})
    await store.update_node("n40", hardware={"conditions": {"GPUErrors": held}})  # revoked: not counted
    records = store.list_nodes()
    seen = metrics.seen_on_loop(store, lambda name: name in connected, records)
    got = metrics.view_state_counts(seen)
    expected = Counter(
        ("e", node_state(n, store.node_steps(n.name), n.name in connected).value) for n in records
    )
    assert got == expected
    conn = metrics.read_only(store.path)
    try:
        assert got == metrics.node_state_counts(conn.execute(metrics.NODE_SCAN_SQL), frozenset(connected))
        sql = {(e, k): n for e, k, n in conn.execute(metrics.CONDITION_SCAN_SQL)}
    finally:
        conn.close()
    assert metrics.view_condition_counts(records) == sql == {("e", "GPUsMissing"): 1, ("e", "GPUErrors"): 2}


async def test_steps_are_read_only_where_they_decide_the_state(store: SqliteStore) -> None:
    connected, revoked = await fleet(store)
    read: list[str] = []

    class Steps:
        def node_steps(self, name: str) -> Any:
            read.append(name)
            return store.node_steps(name)

    asked: list[str] = []

    def up(name: str) -> bool:
        asked.append(name)
        return name in connected

    records = store.list_nodes()
    metrics.seen_on_loop(Steps(), up, records)
    busy = {
        n.name
        for n in records
        if n.name in connected and n.plan_digest and not n.revoked and not n.hardware.get("quarantine")
    }
    assert set(read) == busy and len(read) == len(busy)
    assert not set(asked) & revoked  # a revoked node's state does not depend on its stream


async def test_fleet_gauges_from_the_view_equal_those_from_the_sqlite_file(store: SqliteStore) -> None:
    app, _ = await app_with_fleet(store)
    on_loop = Counting()
    from_view = metrics.FleetCollector(app, on_loop, None, min_seconds=0, slice_nodes=7)  # type: ignore[arg-type]
    from_file = metrics.FleetCollector(app, direct, store.path, min_seconds=0)  # type: ignore[arg-type]
    got = families(from_view)
    assert without_scan(got) == without_scan(families(from_file))
    nodes = len(store.list_nodes())
    assert on_loop.calls == 1 + -(-nodes // 7)  # the environments and records, then a turn per slice
    assert got[("tether_nodes", (("environment", "e"), ("state", "offline")))] == 8
    assert got[(SCAN, ())] >= 0
    from_file.close()


async def test_a_loop_that_stops_answering_during_the_count_leaves_the_fleet_gauges_out(
    store: SqliteStore,
) -> None:
    app, _ = await app_with_fleet(store)
    collector = metrics.FleetCollector(app, Counting(fail_at=3), None, min_seconds=0, slice_nodes=10)  # type: ignore[arg-type]
    assert list(collector.collect()) == []


# -- nodes streaming to another replica -----------------------------------------------------------


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Replica, Replica]]:
    bus = Bus()
    a = await replica(tmp_path / "shared.db", tmp_path, bus)
    b = await replica(tmp_path / "shared.db", tmp_path, bus)
    yield a, b
    for r in (a, b):
        await r.close()


async def test_a_node_streaming_to_another_replica_is_not_counted_offline(
    pair: tuple[Replica, Replica],
) -> None:
    a, b = pair
    await apply(a, "one")
    await streaming(b)
    await wait_for(lambda: a.hub.connected("n1"))
    collector = metrics.FleetCollector(a.app, direct, None, min_seconds=0)
    got = families(collector)
    e = (("environment", "e"),)
    record = a.app.store.get_node("n1")
    assert record is not None
    shown = node_state(record, a.app.store.node_steps("n1"), a.hub.connected("n1")).value  # node list
    assert shown == "provisioning"
    assert got[("tether_nodes", (*e, ("state", shown)))] == 1
    assert got[("tether_nodes", (*e, ("state", "offline")))] == 0
    assert got[("tether_agents_connected", ())] == 0  # the stream is b's
    assert (
        families(metrics.FleetCollector(b.app, direct, None, min_seconds=0))[("tether_agents_connected", ())]
        == 1
    )


# -- this replica's lead and the live replicas ----------------------------------------------------


async def test_the_lead_and_the_live_replicas(store: SqliteStore) -> None:
    app, _ = await app_with_fleet(store)
    collector = metrics.FleetCollector(app, direct, None, min_seconds=0)  # type: ignore[arg-type]
    got = families(collector)
    assert ("tether_replica_leader", ()) not in got  # no replicas yet (starting)
    leading = [True]
    registry = Registry(store, "127.0.0.1:1", "test", leading=lambda: leading[0])
    await registry.report()
    now = now_ms()
    await store.kv_put(REPLICA_PREFIX + "other", Entry("other", "10.0.0.2:1", "t", 0, now).to_bytes())
    await store.kv_put(REPLICA_PREFIX + "gone", Entry("gone", "10.0.0.3:1", "t", 0, now - 60_000).to_bytes())
    app.replicas = SimpleNamespace(leader=SimpleNamespace(held=True), registry=registry, shared=True)
    got = families(collector)
    assert got[("tether_replica_leader", ())] == 1
    assert got[("tether_replicas_live", ())] == 2  # this one and "other", not the stale one
    app.replicas.leader.held = False
    assert families(collector)[("tether_replica_leader", ())] == 0
    app.replicas.shared = False  # SQLite: one process, the file is not read on the loop for it
    assert families(collector)[("tether_replicas_live", ())] == 1


# -- /readyz: the database through the store, and the lead ----------------------------------------


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class Database:
    """``list_audit`` as the PostgreSQL store answers it: at once, an error, or never."""

    def __init__(self) -> None:
        self.mode = "up"
        self.asked = 0

    async def list_audit(self, **kwargs: Any) -> list[Any]:
        self.asked += 1
        if self.mode == "down":
            raise StoreError("store unavailable: connection refused")
        if self.mode == "hung":
            await asyncio.sleep(3600)
        return []


@pytest.fixture
async def listening(store: SqliteStore) -> AsyncIterator[tuple[metrics.MetricsListener, SimpleNamespace]]:
    app, _ = await app_with_fleet(store)
    database = Database()
    app.store = SimpleNamespace(
        list_nodes=store.list_nodes,
        node_steps=store.node_steps,
        list_environments=store.list_environments,
        list_audit=database.list_audit,
        database=database,
    )
    grpc_port = socket.create_server(("127.0.0.1", 0))
    listener = metrics.MetricsListener("127.0.0.1:0", None)
    listener.attach(app, asyncio.get_running_loop(), f"127.0.0.1:{grpc_port.getsockname()[1]}")  # type: ignore[arg-type]
    listener.probes.serving = True
    yield listener, app
    await asyncio.to_thread(listener.close)
    grpc_port.close()


async def test_readiness_asks_the_database_through_the_store(
    listening: tuple[metrics.MetricsListener, SimpleNamespace], monkeypatch: pytest.MonkeyPatch
) -> None:
    listener, app = listening
    url = f"http://{listener.address}/readyz"
    status, body = await asyncio.to_thread(get, url)
    assert status == 200 and "ok store" in body and "FAIL" not in body, body
    assert app.store.database.asked == 1
    assert "info leader: not known yet" in body
    app.store.database.mode = "down"
    status, body = await asyncio.to_thread(get, url)
    assert status == 503 and "FAIL store: store unavailable: connection refused" in body.splitlines(), body
    monkeypatch.setattr(metrics, "METRICS_PROBE_SECONDS", 0.2)
    app.store.database.mode = "hung"
    status, body = await asyncio.to_thread(get, url)
    assert status == 503 and "FAIL store: store unavailable: no answer within 0.2s" in body, body
    app.store.database.mode = "up"
    assert (await asyncio.to_thread(get, url))[0] == 200


async def test_readiness_says_which_replica_leads_and_never_fails_on_it(
    listening: tuple[metrics.MetricsListener, SimpleNamespace], store: SqliteStore
) -> None:
    listener, app = listening
    url = f"http://{listener.address}/readyz"
    registry = Registry(store, "127.0.0.1:1", "test", leading=lambda: False)
    app.replicas = SimpleNamespace(leader=SimpleNamespace(held=True), registry=registry, shared=True)
    status, body = await asyncio.to_thread(get, url)
    assert status == 200 and "info leader: this replica leads" in body, body
    app.replicas.leader.held = False
    status, body = await asyncio.to_thread(get, url)
    assert status == 200 and "info leader: not this replica; none leads now" in body, body
    entry = Entry("other", "10.0.0.2:7443", "t", 0, now_ms(), leader=True)
    await store.kv_put(REPLICA_PREFIX + "other", entry.to_bytes())
    status, body = await asyncio.to_thread(get, url)
    assert status == 200 and "info leader: not this replica; 10.0.0.2:7443 leads" in body, body
    sqlite = metrics.MetricsListener("127.0.0.1:0", store.path)  # one replica: no line on the lead
    sqlite.attach(app, asyncio.get_running_loop(), "127.0.0.1:1")  # type: ignore[arg-type]
    try:
        _, body = await asyncio.to_thread(get, f"http://{sqlite.address}/readyz")
        assert "ok store" in body and "leader" not in body, body
    finally:
        await asyncio.to_thread(sqlite.close)


async def test_metrics_from_the_view_over_http(
    listening: tuple[metrics.MetricsListener, SimpleNamespace],
) -> None:
    listener, _ = listening
    status, body = await asyncio.to_thread(get, f"http://{listener.address}/metrics")
    assert status == 200
    assert 'tether_nodes{environment="e",state="offline"} 8.0' in body
    assert "tether_agents_connected 32.0" in body
