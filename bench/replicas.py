"""The store and replica figures (``--only store``, ``--only replicas``), on a scratch PostgreSQL.

``store``: the same controller on SQLite (the baseline) and on PostgreSQL, one after the other in
one run: enrollments/s, persisted output lines/s and controller CPU per heartbeat.

``replicas``: controllers sharing one PostgreSQL database. Scale-out efficiency is the controller
CPU-seconds per heartbeat of one fleet served by two replicas (both processes together) over the
same fleet on one replica; then a failover storm: the fleet split over both replicas emits events,
one replica is killed with ``kill -9``, and its agents re-attach to the survivor (each simulated
agent moves to the next address after a failure, as the real agent does with ``--controller A,B``).

The PostgreSQL server runs on the clients' core: the figures are the controller's CPU, pinned to
the server core as in every other scenario.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench import messages
from bench.common import SERVER_CPUS, Figure, log
from bench.scenarios import (
    CAPACITY_FLAGS,
    STORM_TIMEOUT,
    Sizes,
    burst,
    connect,
    count_storm,
    enroll_span,
    names,
    split,
    steady_window,
)
from bench.servers import Controller, Sims
from tests.pgscratch import ScratchCluster, start_cluster
from tether.controller.limits import ANONYMOUS_CONCURRENCY

Emit = Callable[[Figure], object]
STORE_ENROLLMENTS = {True: 600, False: 3000}  # by quick
REPLICA_AGENTS = {True: 1000, False: 5000}  # the scale-out fleet and the failover storm, by quick
# Enrollments in flight, all client processes together: the controller's slots for anonymous calls,
# so none is refused for want of one; the same on either store.
ENROLL_IN_FLIGHT = ANONYMOUS_CONCURRENCY


class StoreController(Controller):
    """A controller replica on a given store; its CA comes from its admin.conf (the store holds it)."""

    def __init__(self, work: Path, name: str, heartbeat: int, store: list[str]) -> None:
        super().__init__(work, heartbeat, *CAPACITY_FLAGS, *store)
        self.name = name
        self.data_dir = work / name

    @property
    def ca_file(self) -> Path:
        path = self.work / f"{self.name}-ca.crt"
        if not path.exists():
            doc = yaml.safe_load((self.data_dir / "admin.conf").read_text())
            path.write_text(doc["ca"])
        return path


def _pg_flags(cluster: ScratchCluster, work: Path, database: str) -> list[str]:
    url = cluster.create_database(database)
    return ["--store", url, "--store-key-file", str(work / f"{database}.key")]


@dataclass
class StoreRun:
    enroll_rate: float = 0.0
    enroll_cpu_ms: float = 0.0
    lines_per_s: float = 0.0
    events_cpu_pct: float = 0.0
    cpu_ms_per_heartbeat: float = 0.0
    heartbeats_per_s: float = 0.0


def _enroll(ctl: Controller, work: Path, label: str, count: int) -> tuple[list[str], float, float]:
    """Enroll ``count`` simulated agents for real: (their identity files, rate, CPU ms each)."""
    ids = work / f"{label}-ids"
    ids.mkdir(exist_ok=True)
    token = ctl.token(messages.BENCH_ENV, uses=count + 10)
    nsims = Sims.needed(count)
    parts = split(names(label, count), nsims)
    sims = Sims(work, f"{label}-enroll", nsims)
    try:
        sims.call(lambda i: {"cmd": "prepare_enroll", "names": parts[i]})
        c0 = ctl.p.cpu_seconds()
        replies = sims.call(
            lambda i: {
                "cmd": "enroll",
                "target": ctl.address,
                "ca": str(ctl.ca_file),
                "token": token,
                "concurrency": max(1, ENROLL_IN_FLIGHT // nsims),
                "out": str(ids / f"ids-{i}.jsonl"),
            },
            timeout=1800,
        )
        c1 = ctl.p.cpu_seconds()
    finally:
        sims.close()
    ok, span = enroll_span(replies)
    if ok != count:
        raise RuntimeError(f"{label}: {count - ok} of {count} enrollments failed")
    return [str(ids / f"ids-{i}.jsonl") for i in range(nsims)], ok / span, 1000 * (c1 - c0) / ok


def _store_run(ctl: StoreController, work: Path, sizes: Sizes, quick: bool) -> StoreRun:
    out = StoreRun()
    ctl.start()
    try:
        log(f"{ctl.name}: controller listening on {ctl.address} (pinned to CPU {sorted(SERVER_CPUS)})")
        ctl.apply(messages.environment_yaml(messages.BENCH_ENV, messages.BENCH_STEPS))
        files, out.enroll_rate, out.enroll_cpu_ms = _enroll(ctl, work, ctl.name, STORE_ENROLLMENTS[quick])
        log(f"  {ctl.name} enrollment: {out.enroll_rate:.0f}/s, {out.enroll_cpu_ms:.1f} ms CPU each")
        fleet = Sims(work, f"{ctl.name}-fleet", len(files))
        try:
            fleet.call(lambda i: {"cmd": "load", "files": [files[i]]})
            n = STORE_ENROLLMENTS[quick]
            connect(fleet, ctl, bare=False, provision=True)
            fleet.wait(
                f"{ctl.name}: fleet provisioned",
                lambda s: s["streaming"] == n and s["provisioned"] == n,
                timeout=n / 25 + 120,
            )
            time.sleep(3)
            st = steady_window(ctl.p, fleet, sizes.window)
            out.cpu_ms_per_heartbeat = 1000 * st.cpu_seconds / max(st.heartbeats, 1)
            out.heartbeats_per_s = st.hb_rate
            keep = [min(sizes.events_agents, 10**9)] + [0] * (len(files) - 1)
            fleet.call(lambda i: {"cmd": "keep", "count": keep[i]})
            out.lines_per_s, out.events_cpu_pct, _ = burst(fleet, ctl.p, sizes.events_window)
            fleet.wait(f"{ctl.name}: outboxes drained", lambda s: s["pending"] == 0, 180)
        finally:
            fleet.close()
        log(
            f"  {ctl.name}: {out.cpu_ms_per_heartbeat:.3f} ms CPU per heartbeat, "
            f"{out.lines_per_s:.0f} lines/s persisted at {out.events_cpu_pct:.0f}% CPU"
        )
    finally:
        ctl.stop()
    return out


def run_store(work: Path, sizes: Sizes, quick: bool, emit: Emit) -> None:
    """SQLite (baseline) and PostgreSQL, the same scenario on each."""
    cluster = start_cluster()
    try:
        lite = _store_run(StoreController(work, "sqlite", sizes.heartbeat, []), work, sizes, quick)
        pg_flags = _pg_flags(cluster, work, "bench_store")
        pg = _store_run(StoreController(work, "postgresql", sizes.heartbeat, pg_flags), work, sizes, quick)
    finally:
        cluster.remove()
    n = STORE_ENROLLMENTS[quick]
    common = {"enrollments": n, "events_agents": sizes.events_agents, "quick": quick}
    emit(
        Figure(
            "store.postgresql.enrollment_rate",
            pg.enroll_rate,
            "enrollments/s",
            lite.enroll_rate,
            ">= 250",
            pg.enroll_rate >= 250,
            detail={**common, "cpu_ms_each": pg.enroll_cpu_ms, "sqlite_cpu_ms_each": lite.enroll_cpu_ms},
        )
    )
    emit(
        Figure(
            "store.postgresql.persisted_lines_per_s",
            pg.lines_per_s,
            "lines/s",
            lite.lines_per_s,
            ">= 100000",
            pg.lines_per_s >= 100_000,
            detail={**common, "cpu_pct": pg.events_cpu_pct, "sqlite_cpu_pct": lite.events_cpu_pct},
        )
    )
    emit(
        Figure(
            "store.postgresql.cpu_ms_per_heartbeat",
            pg.cpu_ms_per_heartbeat,
            "ms",
            lite.cpu_ms_per_heartbeat,
            "",
            True,
            detail={**common, "heartbeats_per_s": pg.heartbeats_per_s},
        )
    )


# -- two replicas ---------------------------------------------------------------------------------


def _fleet_cpu_per_heartbeat(
    replicas: list[StoreController], fleet: Sims, sizes: Sizes
) -> tuple[float, dict[str, Any]]:
    """CPU-seconds of every replica together per heartbeat, over one steady window."""
    c0 = sum(r.p.cpu_seconds() for r in replicas)
    st = steady_window(replicas[0].p, fleet, sizes.window)
    c1 = sum(r.p.cpu_seconds() for r in replicas)
    per = (c1 - c0) / max(st.heartbeats, 1)
    return per, {"heartbeats_per_s": st.hb_rate, "by_target": fleet.stats().get("by_target", {})}


def _connect_all(fleet: Sims, replicas: list[StoreController], n: int, what: str) -> None:
    target = ",".join(r.address for r in replicas)
    fleet.call(
        lambda i: {
            "cmd": "connect",
            "target": target,
            "ca": str(replicas[0].ca_file),
            "bare": False,
            "provision": True,
            "max_connecting": 64,
            "offset": i,
        }
    )
    fleet.wait(what, lambda s: s["streaming"] == n and s["provisioned"] == n, timeout=n / 25 + 180)
    time.sleep(3)


def run_replicas(work: Path, sizes: Sizes, quick: bool, emit: Emit) -> None:
    """Scale-out efficiency (2 replicas over 1), then the failover storm (kill -9 of one)."""
    cluster = start_cluster()
    n = REPLICA_AGENTS[quick]
    replicas: list[StoreController] = []
    try:
        flags = _pg_flags(cluster, work, "bench_replicas")
        a = StoreController(work, "replica-a", sizes.heartbeat, flags)
        a.start()
        replicas.append(a)
        a.apply(messages.environment_yaml(messages.BENCH_ENV, messages.BENCH_STEPS))
        files, _, _ = _enroll(a, work, "replicas", n)
        one = _scale_window(work, [a], files, n, sizes, "one replica")
        b = StoreController(work, "replica-b", sizes.heartbeat, flags)
        b.start()
        replicas.append(b)
        two = _scale_window(work, [a, b], files, n, sizes, "two replicas")
        ratio = two[0] / one[0] if one[0] else None
        emit(
            Figure(
                "replicas.scale_out_cpu_per_heartbeat",
                ratio,
                "x (2 replicas / 1)",
                1.0,
                "<= 1.1",
                ratio is not None and ratio <= 1.1,
                ratio=ratio,
                detail={
                    "agents": n,
                    "one_replica_cpu_ms_per_heartbeat": 1000 * one[0],
                    "two_replicas_cpu_ms_per_heartbeat": 1000 * two[0],
                    **{f"two_{k}": str(v) for k, v in two[1].items()},
                },
            )
        )
        _failover_storm(work, replicas, files, n, sizes, emit)
    finally:
        for r in replicas:
            r.stop()
        cluster.remove()


def _scale_window(
    work: Path, replicas: list[StoreController], files: list[str], n: int, sizes: Sizes, label: str
) -> tuple[float, dict[str, Any]]:
    fleet = Sims(work, f"scale-{len(replicas)}", len(files))
    try:
        fleet.call(lambda i: {"cmd": "load", "files": [files[i]]})
        _connect_all(fleet, replicas, n, f"{label}: fleet provisioned")
        per, detail = _fleet_cpu_per_heartbeat(replicas, fleet, sizes)
    finally:
        fleet.close()
    log(f"  {label}: {1000 * per:.3f} ms controller CPU per heartbeat ({detail})")
    return per, detail


def _failover_storm(
    work: Path,
    replicas: list[StoreController],
    files: list[str],
    n: int,
    sizes: Sizes,
    emit: Emit,
) -> None:
    a, b = replicas
    fleet = Sims(work, "failover", len(files))
    try:
        fleet.call(lambda i: {"cmd": "load", "files": [files[i]]})
        _connect_all(fleet, replicas, n, "failover: fleet provisioned on both replicas")
        on_a = int(fleet.stats().get("by_target", {}).get(a.address, 0))
        fleet.call({"cmd": "periodic", "interval": sizes.storm_event_interval})
        time.sleep(sizes.storm_event_interval + 2)
        unacked = fleet.stats()["pending"]
        t_kill = a.kill9()
        fleet.wait(
            "failover: every agent streaming to the survivor",
            lambda s: s["streaming"] == n and s.get("by_target", {}).get(b.address, 0) == n,
            timeout=STORM_TIMEOUT,
        )
        reattach = time.monotonic() - t_kill
        time.sleep(3)
        fleet.call({"cmd": "periodic", "on": False})
        fleet.wait("failover: outboxes drained", lambda s: s["pending"] == 0, 180)
        reports: dict[str, list[int]] = {}
        for r in fleet.call({"cmd": "report"}):
            reports.update(r["agents"])
    finally:
        fleet.close()
    lost, dup, checked = _verify_pg(b, reports)
    log(
        f"  failover: {on_a} agents moved in {reattach:.1f}s; {checked} events: {lost} lost, {dup} duplicated"
    )
    detail = {"agents": n, "on_killed_replica": on_a, "unacked_at_kill": unacked, "checked": checked}
    emit(
        Figure(
            "replicas.failover_reattach_seconds", reattach, "s", None, "<= 30", reattach <= 30, detail=detail
        )
    )
    emit(Figure("replicas.failover_events_lost", lost, "events", 0, "== 0", lost == 0, detail=detail))
    emit(Figure("replicas.failover_events_duplicated", dup, "events", 0, "== 0", dup == 0, detail=detail))


def _verify_pg(ctl: StoreController, reports: dict[str, list[int]]) -> tuple[int, int, int]:
    """Every periodic event is in the database exactly once, under the seq it was given."""
    import psycopg

    url = next(ctl.extra[i + 1] for i, v in enumerate(ctl.extra) if v == "--store")
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT node, seq, body FROM events WHERE step = 'custom-storm'").fetchall()
    return count_storm([(node, seq, json.loads(body)["message"]) for node, seq, body in rows], reports)
