"""The scenarios. Each runs against the bare baseline and against the real controller, in one run.

One fleet per server: N simulated agents connect (capacity: RSS, CPU and heartbeats per
CPU-second in a steady window); the first ``storm_agents`` of them stay connected while a few
other agents stream output (events); then those connected agents emit events, the server is
killed with ``kill -9`` and restarted on the same port (reconnect storm; on the controller an
admin runs ``tetherctl node list`` all along, bench/prober.py). The controller's fleet enrolls
for real first (enrollment rate), and a real agent runs a 50-step plan last.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import statistics
import subprocess
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import agent, messages
from bench.common import BIN, SERVER_CPUS, Figure, Proc, log
from bench.prober import MIN_WINDOW_S, AdminProber, StormProbes, node_list_figure
from bench.servers import MAX_AGENTS_PER_SIM, Bare, Controller, Server, Sims
from bench.stats import p99
from tether.controller.limits import QUOTA_PAUSE_SECONDS

GIB_MIB = 2048
ENROLL_CONCURRENCY = 16  # enrollments in flight per client process
CONNECT_CONCURRENCY = 64  # TLS handshakes in flight per client process while a fleet first comes up
EVENT_LINES = 100  # lines per output event (the agent's runner sends up to 500 every 0.25 s)
EVENT_WINDOW = 4  # output events an agent has sent and not yet seen acknowledged
# Seconds for every agent to re-attach (and then for every outbox to drain) before the storm counts
# as failed: 10x the target, so a slow storm on a loaded machine still gives its time.
STORM_TIMEOUT = 300.0
STORM_TARGET_S = 30.0  # every storm agent re-attached within this long after the kill
CAPACITY_AGENTS = 15_000  # connected at once for capacity.controller_rss_mib (the full run's fleet)
RSS_PER_AGENT_TARGET = 1.15  # the controller's RSS per connected agent / the bare server's
# Open files the server holds besides one socket per agent: the store (database, WAL, shared
# memory), listening sockets, its log, stdio, gRPC's and the event loop's own descriptors
# (24 in all with 10,000 agents); the margin leaves room for the connections that come and go.
SERVER_FD_MARGIN = 200

Emit = Callable[[Figure], object]


@dataclass(frozen=True)
class Sizes:
    agents: int  # capacity: simulated agents, each with its own key, certificate and connection
    heartbeat: int  # seconds between health reports (the server's setting)
    window: float  # seconds of steady state measured
    bare_enrollments: int
    events_agents: int
    events_window: float
    storm_agents: int
    storm_event_interval: float
    overhead_runs: int  # plan runs of the real agent (each followed by a bash pass)
    overhead_pairs: int  # interleaved agent/bash passes of the agent's step path (wall clock)
    callgrind_pairs: int  # 10-step and 50-step plans counted by callgrind, each this many times
    idle_window: float  # seconds two idle agents are watched (CPU, RSS)
    flood_agents: int  # flood: agents that only heartbeat while one other floods output
    flood_window: float  # seconds each flood window (unloaded, then flooded) is measured


FULL = Sizes(
    agents=15_000,
    heartbeat=10,
    window=30.0,
    bare_enrollments=3000,
    events_agents=100,
    events_window=15.0,
    storm_agents=10_000,
    storm_event_interval=10.0,  # 1,000 events/s over the storm's agents, as 5,000 agents at 5 s were
    overhead_runs=5,
    overhead_pairs=40,
    callgrind_pairs=3,
    idle_window=60.0,
    flood_agents=2000,
    flood_window=30.0,
)
QUICK = Sizes(
    agents=2000,
    heartbeat=2,
    window=10.0,
    bare_enrollments=1000,
    events_agents=50,
    events_window=8.0,
    storm_agents=1000,
    storm_event_interval=5.0,
    overhead_runs=3,
    overhead_pairs=12,
    callgrind_pairs=1,
    idle_window=30.0,
    flood_agents=2000,
    flood_window=10.0,
)


def names(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i:05d}" for i in range(n)]


def split(items: list[str], parts: int) -> list[list[str]]:
    return [items[i::parts] for i in range(parts)]


def check_open_files(sizes: Sizes) -> int:
    """The open-files limit every server and client of this run starts with: this process's soft
    limit, raised to the hard one (children inherit it). RuntimeError where a server could not
    hold a socket per agent of the fleet plus its own files, which would fail late and obscurely
    (the server refusing connections mid-run)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard and hard != resource.RLIM_INFINITY:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    need = max(sizes.agents, MAX_AGENTS_PER_SIM) + SERVER_FD_MARGIN
    if soft != resource.RLIM_INFINITY and soft < need:
        raise RuntimeError(
            f"the open-files limit is {soft}: {sizes.agents} agents need {need} in the server"
            f" (a socket per agent, {SERVER_FD_MARGIN} more for its own files); raise it (ulimit -n)"
        )
    return int(soft)


def shares(total: int, sizes: list[int]) -> list[int]:
    """How many of ``total`` to take from each part, filling the parts in order."""
    out = []
    for size in sizes:
        take = min(size, total)
        out.append(take)
        total -= take
    return out


@dataclass
class Steady:
    """One steady-state window on a server: CPU, RSS, heartbeats the clients sent."""

    seconds: float
    cpu_seconds: float
    heartbeats: int
    rss_mib: float
    fds: int

    @property
    def cpu_pct(self) -> float:
        return 100 * self.cpu_seconds / self.seconds

    @property
    def hb_rate(self) -> float:
        return self.heartbeats / self.seconds

    @property
    def hb_per_cpu_second(self) -> float:
        return self.heartbeats / max(self.cpu_seconds, 1e-9)


def steady_window(proc: Proc, sims: Sims, seconds: float) -> Steady:
    s0, c0, t0 = sims.stats(), proc.cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    s1, c1, t1 = sims.stats(), proc.cpu_seconds(), time.monotonic()
    return Steady(t1 - t0, c1 - c0, s1["heartbeats"] - s0["heartbeats"], proc.rss_mib(), proc.open_fds())


def connect(sims: Sims, server: Server, *, bare: bool, provision: bool) -> None:
    """Start every agent of ``sims``; at most CONNECT_CONCURRENCY handshakes in flight per process."""
    sims.call(
        {
            "cmd": "connect",
            "target": server.address,
            "ca": str(server.ca_file),
            "bare": bare,
            "provision": provision,
            "max_connecting": CONNECT_CONCURRENCY,
        }
    )


def enroll_span(replies: list[dict[str, Any]]) -> tuple[int, float]:
    ok = sum(r["ok"] for r in replies)
    errors = [r for r in replies if r["errors"]]
    if errors:
        log(f"  enrollment errors: {[(r['errors'], r['first_error']) for r in errors]}")
    span = max(r["t1"] for r in replies) - min(r["t0"] for r in replies)
    return ok, span


def burst(sims: Sims, proc: Proc, seconds: float) -> tuple[float, float, dict[str, Any]]:
    """Output lines acknowledged per second (and server CPU %) while every agent of ``sims`` streams."""
    sims.call(
        {
            "cmd": "burst",
            "lines_per_event": EVENT_LINES,
            "events_per_batch": 1,
            "window_events": EVENT_WINDOW,
        }
    )
    time.sleep(2)  # warm up
    s0, c0, t0 = sims.stats(), proc.cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    s1, c1, t1 = sims.stats(), proc.cpu_seconds(), time.monotonic()
    sims.call({"cmd": "burst", "on": False})
    rate = (s1["lines_acked"] - s0["lines_acked"]) / (t1 - t0)
    return rate, 100 * (c1 - c0) / (t1 - t0), s1


# -- one fleet on one server ----------------------------------------------------------------------


@dataclass
class FleetResult:
    rss_idle: float = 0.0
    connected: int = 0
    connect_seconds: float = 0.0
    steady: Steady | None = None
    lines_per_s: float = 0.0
    events_cpu_pct: float = 0.0
    events_acked: int = 0
    events_stored: int = -1
    restart_s: float = 0.0
    reattach_s: float = 0.0
    storm_unacked_at_kill: int = 0
    fds_after_storm: int = 0
    node_list: StormProbes | None = None  # the admin's node list around the storm (controller only)
    storm_errors: dict[str, int] = field(default_factory=dict)
    storm_failed_after_ready: dict[str, int] = field(default_factory=dict)  # attempts begun after it
    storm_reports: dict[str, list[int]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def rss_per_agent_kib(self) -> float:
        assert self.steady is not None
        return (self.steady.rss_mib - self.rss_idle) * 1024 / max(self.connected, 1)

    @property
    def agents_per_2gib(self) -> int:
        per = self.rss_per_agent_kib
        return int((GIB_MIB - self.rss_idle) * 1024 / per) if per > 0 else 0


def run_fleet(
    work: Path,
    server: Server,
    sizes: Sizes,
    *,
    bare: bool,
    load_fleet: Callable[[Sims], list[int]],
    load_events: Callable[[Sims, list[int]], None],
    admin_conf: Path | None = None,
) -> FleetResult:
    """Capacity, then events, then the reconnect storm, on one server already started; with
    ``admin_conf`` an admin probes ``node list`` before and through the storm."""
    out = FleetResult()
    label = "bare" if bare else "controller"
    time.sleep(1)
    out.rss_idle = server.p.rss_mib()
    fleet = Sims(work, f"{label}-fleet", Sims.needed(sizes.agents))
    try:
        # Capacity: every agent its own certificate and connection; then a steady window.
        per_sim = load_fleet(fleet)
        t0 = time.monotonic()
        connect(fleet, server, bare=bare, provision=True)
        n = sizes.agents
        fleet.wait(
            f"{label}: every agent streaming, its plan received and its events acknowledged",
            lambda s: s["streaming"] == n and s["provisioned"] == n,
            timeout=n / 25 + 120,
        )
        out.connect_seconds = time.monotonic() - t0
        time.sleep(5)  # let the last connections' first writes settle
        out.steady = steady_window(server.p, fleet, sizes.window)
        out.connected = fleet.stats()["streaming"]
        st = out.steady
        log(
            f"  {label} capacity: {out.connected} agents after {out.connect_seconds:.0f}s, "
            f"RSS {st.rss_mib:.0f} MiB (idle {out.rss_idle:.0f}), {out.rss_per_agent_kib:.0f} KiB/agent, "
            f"{st.hb_rate:.0f} heartbeats/s at {st.cpu_pct:.0f}% CPU, {st.fds} fds"
        )

        # The first storm_agents stay connected; the others go.
        keep = shares(sizes.storm_agents, per_sim)
        fleet.call(lambda i: {"cmd": "keep", "count": keep[i]})

        # Events: other agents stream output while the rest of the fleet idles.
        try:
            ev = Sims(work, f"{label}-events", 1)
            try:
                load_events(ev, keep)
                connect(ev, server, bare=bare, provision=False)
                ev.wait(
                    f"{label}: event agents streaming", lambda s: s["streaming"] == sizes.events_agents, 120
                )
                out.lines_per_s, out.events_cpu_pct, _ = burst(ev, server.p, sizes.events_window)
                s = ev.wait(f"{label}: event outboxes drained", lambda s: s["pending"] == 0, 120)
                out.events_acked = s["events_acked"]
            finally:
                ev.close()
            log(f"  {label} events: {out.lines_per_s:.0f} lines/s at {out.events_cpu_pct:.0f}% CPU")
        except Exception as exc:
            out.failed["events"] = _failure(exc)

        # Reconnect storm: events flowing, kill -9, restart on the same port.
        try:
            prober = None if admin_conf is None else AdminProber(admin_conf, work / f"prober-{label}.log")
            try:
                storm(out, server, fleet, sizes, label, sum(keep), prober)
            finally:
                if prober is not None:
                    prober.close()
        except Exception as exc:
            out.failed["storm"] = _failure(exc)
    except Exception as exc:
        out.failed["capacity"] = _failure(exc)
    finally:
        fleet.close()
    return out


def storm(
    out: FleetResult,
    server: Server,
    fleet: Sims,
    sizes: Sizes,
    label: str,
    storm_n: int,
    prober: AdminProber | None,
) -> None:
    """The connected agents emit events; kill -9; restart on the same port; every agent re-attaches,
    every outbox drains. ``prober``: node list timed before the kill (the baseline), and from the
    kill until every agent re-attached, at least MIN_WINDOW_S after the restart was ready."""
    fleet.call({"cmd": "periodic", "interval": sizes.storm_event_interval})
    probes = None
    if prober is not None:
        probes = out.node_list = StormProbes()
        probes.full_list = prober.full()  # the whole list once, as an operator waits for it
        prober.start()
    time.sleep(sizes.storm_event_interval + 2)  # every agent has events out, some unacknowledged
    # Real agents reconnect on their own (jittered backoff), not through a shared gate.
    fleet.call({"cmd": "gate", "max_connecting": 0})
    out.storm_unacked_at_kill = fleet.stats()["pending"]
    if prober is not None and probes is not None:
        probes.quiet = prober.stop()
        prober.start()
        probes.niceness, probes.interval = prober.niceness, prober.interval
    t_kill = server.kill9()
    server.start(server.port)
    out.restart_s = server.ready_at - t_kill
    if probes is not None:
        probes.kill, probes.ready = t_kill, server.ready_at
    try:
        s = fleet.wait(
            f"{label}: storm agents re-attached",
            lambda s: s["welcomed_since"] == storm_n,
            timeout=STORM_TIMEOUT,
            since=t_kill,
        )
    except TimeoutError:
        if prober is not None and probes is not None:  # what an admin saw is a figure all the same
            stop_probes(label, prober, probes, None)
        diagnose(server, fleet)
        raise
    out.reattach_s = s["last_welcome"] - t_kill
    out.fds_after_storm = server.p.open_fds()
    log(
        f"  {label} storm: kill -9 with {storm_n} agents and {out.storm_unacked_at_kill} events"
        f" unacknowledged; back after {out.restart_s:.1f}s,"
        f" all re-attached after {out.reattach_s:.1f}s;"
        f" connection attempts begun after the restart that failed:"
        f" {fleet.stats(failed_after=server.ready_at)['failed_after']}"
    )
    end = server.ready_at + MIN_WINDOW_S
    time.sleep(max(3.0, end - time.monotonic()))
    if prober is not None and probes is not None:
        stop_probes(label, prober, probes, s["last_welcome"])
    fleet.call({"cmd": "periodic", "on": False})
    s = fleet.wait(f"{label}: storm outboxes drained", lambda s: s["pending"] == 0, STORM_TIMEOUT)
    out.storm_errors = s["errors"]
    out.storm_failed_after_ready = fleet.stats(failed_after=server.ready_at)["failed_after"]
    for r in fleet.call({"cmd": "report"}):
        out.storm_reports.update(r["agents"])


def stop_probes(label: str, prober: AdminProber, probes: StormProbes, reattached: float | None) -> None:
    """The storm's probes in; ``reattached``: the last agent's Welcome (None: not all came back)."""
    probes.end = time.monotonic()
    probes.storm = prober.stop()
    probes.complete = reattached is not None
    probes.reattached = probes.end if reattached is None else reattached
    after = probes.after_ready
    worst = max((p.ms for p in after), default=0.0)
    log(
        f"  {label} node list: {len(after)} probes after the restart, slowest {worst:.0f} ms,"
        f" {sum(1 for p in after if p.error)} failed; {len(probes.while_down)} while down;"
        f" quiet: {len(probes.quiet)} probes"
    )


def diagnose(server: Server, sims: Sims) -> None:
    """What the agents and the server are doing (logged when a wait times out)."""
    for reply in sims.call({"cmd": "debug"}, timeout=60):
        log(f"  agents: {json.dumps(reply)}")
    spy = BIN / "py-spy"
    if spy.exists():
        dump = subprocess.run(
            [str(spy), "dump", "--pid", str(server.p.pid)], capture_output=True, text=True, check=False
        )
        log(f"  {server.name} threads:\n{dump.stdout[-4000:]}")


def _failure(exc: BaseException) -> str:
    log(f"  FAILED: {exc}\n{traceback.format_exc()}")
    return f"{type(exc).__name__}: {exc}"[:500]


# -- the bare baseline ------------------------------------------------------------------------------


@dataclass
class BareResult:
    enroll_rate: float = 0.0
    enroll_cpu_pct: float = 0.0
    fleet: FleetResult = field(default_factory=FleetResult)


def run_bare(work: Path, sizes: Sizes) -> BareResult:
    out = BareResult()
    bare = Bare(work, sizes.heartbeat)
    try:
        bare.start()
        log(f"bare baseline listening on {bare.address} (pinned to CPU {sorted(SERVER_CPUS)})")
        nsims = Sims.needed(sizes.agents)
        # Unary calls of Enroll's sizes over fresh mTLS connections, as many in flight as Enroll gets.
        sims = Sims(work, "bare-enroll", nsims)
        try:
            parts = split(names("bare-enroll", sizes.bare_enrollments), nsims)
            sims.call(lambda i: {"cmd": "prepare_enroll", "names": parts[i]})
            c0 = bare.p.cpu_seconds()
            replies = sims.call(
                {
                    "cmd": "enroll",
                    "bare": True,
                    "target": bare.address,
                    "ca": str(bare.ca_file),
                    "concurrency": ENROLL_CONCURRENCY,
                }
            )
            c1 = bare.p.cpu_seconds()
        finally:
            sims.close()
        ok, span = enroll_span(replies)
        out.enroll_rate = ok / span
        out.enroll_cpu_pct = 100 * (c1 - c0) / span
        log(
            f"  bare unary calls on fresh connections: {out.enroll_rate:.0f}/s"
            f" at {out.enroll_cpu_pct:.0f}% CPU"
        )

        fleet_names = split(names("bare", sizes.agents), nsims)

        def load_fleet(fleet: Sims) -> list[int]:
            fleet.call(lambda i: {"cmd": "issue", "pki": str(bare.pki), "names": fleet_names[i]})
            return [len(p) for p in fleet_names]

        def load_events(ev: Sims, keep: list[int]) -> None:
            ev.call({"cmd": "issue", "pki": str(bare.pki), "names": names("bare-ev", sizes.events_agents)})

        out.fleet = run_fleet(work, bare, sizes, bare=True, load_fleet=load_fleet, load_events=load_events)
    finally:
        bare.stop()
    return out


# -- the controller -------------------------------------------------------------------------------


# The events figure is what the controller can store, so the per-node output quota is lifted.
CAPACITY_FLAGS = ("--node-output-rate", str(1 << 40))


def run_controller(
    work: Path, sizes: Sizes, base: BareResult, quick: bool, emit: Emit, *, with_agent: bool = True
) -> None:
    ctl = Controller(work, sizes.heartbeat, *CAPACITY_FLAGS)
    ids_dir = work / "identities"
    ids_dir.mkdir(exist_ok=True)
    try:
        ctl.start()
        log(f"controller listening on {ctl.address} (pinned to CPU {sorted(SERVER_CPUS)})")
        ctl.apply(messages.environment_yaml(messages.BENCH_ENV, messages.BENCH_STEPS))
        token = ctl.token(messages.BENCH_ENV, uses=sizes.agents + 10)

        # Enrollment: every simulated agent of the fleet enrolls for real.
        nsims = Sims.needed(sizes.agents)
        parts = split(names("bench", sizes.agents), nsims)
        sims = Sims(work, "enroll", nsims)
        try:
            sims.call(lambda i: {"cmd": "prepare_enroll", "names": parts[i]})
            c0 = ctl.p.cpu_seconds()
            replies = sims.call(
                lambda i: {
                    "cmd": "enroll",
                    "target": ctl.address,
                    "ca": str(ctl.ca_file),
                    "token": token,
                    "concurrency": ENROLL_CONCURRENCY,
                    "out": str(ids_dir / f"ids-{i}.jsonl"),
                },
                timeout=1800,
            )
            c1 = ctl.p.cpu_seconds()
        finally:
            sims.close()
        ok, span = enroll_span(replies)
        rate, cpu = ok / span, 100 * (c1 - c0) / span
        log(f"  enrollment: {ok} in {span:.1f}s = {rate:.0f}/s at {cpu:.0f}% CPU")
        emit(
            Figure(
                "enrollment.rate",
                rate,
                "enrollments/s",
                base.enroll_rate,
                ">= 150",
                rate >= 150 and ok == sizes.agents,
                detail={
                    "enrolled": ok,
                    "failed": sizes.agents - ok,
                    "seconds": span,
                    "in_flight": ENROLL_CONCURRENCY * nsims,
                    "controller_cpu_pct": cpu,
                    "controller_cpu_ms_per_enrollment": 10 * cpu / rate,
                    "bare_cpu_pct": base.enroll_cpu_pct,
                    "bare_cpu_ms_per_call": 10 * base.enroll_cpu_pct / max(base.enroll_rate, 1e-9),
                },
            )
        )
        id_files = [str(ids_dir / f"ids-{i}.jsonl") for i in range(nsims)]

        # The fleet, on a freshly started controller (idle RSS without enrollment garbage).
        ctl.stop()
        ctl.start(ctl.port)

        def load_fleet(fleet: Sims) -> list[int]:
            replies = fleet.call(lambda i: {"cmd": "load", "files": [id_files[i]]})
            return [int(r["agents"]) for r in replies]

        def load_events(ev: Sims, keep: list[int]) -> None:
            # Enrolled agents that are not connected any more: the last ones of the last files.
            spare = [(i, keep[i]) for i in reversed(range(nsims)) if keep[i] < len(parts[i])]
            file_index, offset = spare[0]
            ev.call(
                {
                    "cmd": "load",
                    "files": [id_files[file_index]],
                    "offset": offset,
                    "count": sizes.events_agents,
                }
            )

        fleet = run_fleet(
            work,
            ctl,
            sizes,
            bare=False,
            load_fleet=load_fleet,
            load_events=load_events,
            admin_conf=ctl.data_dir / "admin.conf",
        )
        emit_fleet(ctl, sizes, base.fleet, fleet, quick, emit)
        if not with_agent:
            return
        try:
            for fig in agent.agent_figures(work, ctl, sizes):
                emit(fig)
        except Exception as exc:
            for fig in agent.failed(_failure(exc)):
                emit(fig)
    finally:
        ctl.stop()


def run_agent_only(work: Path, sizes: Sizes, emit: Emit) -> None:
    """Only the agent's figures (``--only agent``): a controller, the agent's overhead and footprint."""
    ctl = Controller(work, sizes.heartbeat)
    try:
        ctl.start()
        log(f"controller listening on {ctl.address} (pinned to CPU {sorted(SERVER_CPUS)})")
        for fig in agent.agent_figures(work, ctl, sizes):
            emit(fig)
    finally:
        ctl.stop()


def capacity_figures(
    sizes: Sizes, bare: FleetResult, fleet: FleetResult, quick: bool, open_files_limit: int = -1
) -> list[Figure]:
    """The capacity figures of one controller fleet against the bare server's (the full run also
    gives the RSS with the whole fleet connected)."""
    names = ["capacity.rss_per_agent_kib", "capacity.agents_per_2gib", "capacity.heartbeats_per_cpu_second"]
    if not quick:
        names.insert(0, "capacity.controller_rss_mib")
    if "capacity" in fleet.failed or fleet.steady is None or bare.steady is None:
        err = fleet.failed.get("capacity") or bare.failed.get("capacity", "no steady state")
        return [Figure(name, None, "", None, "", False, detail={"error": err}) for name in names]
    st, bst = fleet.steady, bare.steady
    common = {
        "agents_connected": fleet.connected,
        "bare_streams": bare.connected,
        "heartbeat_seconds": sizes.heartbeat,
        "controller_open_fds": st.fds,
        "controller_open_files_limit": open_files_limit,
        "connect_seconds": fleet.connect_seconds,
        "bare_connect_seconds": bare.connect_seconds,
    }
    rss = {
        "rss_idle_mib": fleet.rss_idle,
        "rss_connected_mib": st.rss_mib,
        "bare_rss_idle_mib": bare.rss_idle,
        "bare_rss_connected_mib": bst.rss_mib,
    }
    out = []
    if not quick:
        out.append(
            Figure(
                "capacity.controller_rss_mib",
                st.rss_mib,
                "MiB",
                bst.rss_mib,
                f"<= {GIB_MIB} with >= {CAPACITY_AGENTS} agents connected",
                fleet.connected >= CAPACITY_AGENTS and st.rss_mib <= GIB_MIB,
                detail={**common, **rss},
            )
        )
    per, bare_per = fleet.rss_per_agent_kib, bare.rss_per_agent_kib
    per_ratio = per / bare_per if bare_per > 0 else None
    out.append(
        Figure(
            "capacity.rss_per_agent_kib",
            per,
            "KiB per connected agent",
            bare_per,
            f"ratio <= {RSS_PER_AGENT_TARGET:g}",
            per_ratio is not None and per_ratio <= RSS_PER_AGENT_TARGET,
            ratio=per_ratio,
            detail={**common, **rss, "how": "(RSS with every agent connected - idle RSS) / agents connected"},
        )
    )
    out.append(
        Figure(
            "capacity.agents_per_2gib",
            fleet.agents_per_2gib,
            "agents",
            bare.agents_per_2gib,
            ">= 10000",
            fleet.agents_per_2gib >= 10_000,
            detail={
                **common,
                **rss,
                "kib_per_agent": per,
                "bare_kib_per_stream": bare_per,
                "how": "(2048 MiB - idle RSS) / RSS added per connected agent",
            },
        )
    )
    ratio = st.hb_per_cpu_second / bst.hb_per_cpu_second
    out.append(
        Figure(
            "capacity.heartbeats_per_cpu_second",
            st.hb_per_cpu_second,
            "msgs per CPU-second",
            bst.hb_per_cpu_second,
            "ratio >= 0.70",
            ratio >= 0.70,
            ratio=ratio,
            detail={
                **common,
                "heartbeats_per_s": st.hb_rate,
                "controller_cpu_pct": st.cpu_pct,
                "bare_heartbeats_per_s": bst.hb_rate,
                "bare_cpu_pct": bst.cpu_pct,
                "window_s": st.seconds,
                "heartbeat_bytes": messages.health_message().ByteSize(),
            },
        )
    )
    return out


def storm_failed(sizes: Sizes, fleet: FleetResult) -> list[Figure]:
    """The storm's figures when it failed (e.g. not every agent re-attached in STORM_TIMEOUT): no
    values, but what the admin's node list saw meanwhile where it was probed."""
    error = {"error": fleet.failed["storm"]}
    names = ("storm.reattach_seconds", "storm.events_lost", "storm.events_duplicated")
    out = [Figure(name, None, "", None, "", False, detail=error) for name in names]
    if fleet.node_list is not None and fleet.node_list.storm:
        fig = node_list_figure(sizes.storm_agents, fleet.node_list)
        out.append(dataclasses.replace(fig, met=False, detail={**fig.detail, **error}))
    elif fleet.node_list is not None:
        out.append(Figure("storm.node_list_p99_ms", None, "ms", None, "", False, detail=error))
    return out


def storm_target(agents: int) -> str:
    full = FULL.storm_agents
    return f"<= {STORM_TARGET_S:g} with {agents} agents" + ("" if agents >= full else f" (full run: {full})")


def emit_fleet(
    ctl: Controller, sizes: Sizes, bare: FleetResult, fleet: FleetResult, quick: bool, emit: Emit
) -> None:
    for fig in capacity_figures(sizes, bare, fleet, quick, ctl.p.open_files_limit()):
        emit(fig)
    if "capacity" in fleet.failed or fleet.steady is None or bare.steady is None:
        return

    if "events" in fleet.failed:
        failure = {"error": fleet.failed["events"]}
        emit(Figure("events.persisted_lines_per_s", None, "lines/s", None, ">= 50000", False, detail=failure))
    else:
        with ctl.db() as db:
            stored = db.execute("SELECT COUNT(*) FROM events WHERE step='custom-burst'").fetchone()[0]
        emit(
            Figure(
                "events.persisted_lines_per_s",
                fleet.lines_per_s,
                "lines/s",
                bare.lines_per_s,
                ">= 50000",
                fleet.lines_per_s >= 50_000 and stored >= fleet.events_acked,
                detail={
                    "agents": sizes.events_agents,
                    "idle_agents_connected": sizes.storm_agents,
                    "lines_per_event": EVENT_LINES,
                    "unacked_window_events": EVENT_WINDOW,
                    "controller_cpu_pct": fleet.events_cpu_pct,
                    "bare_cpu_pct": bare.events_cpu_pct,
                    "events_acked": fleet.events_acked,
                    "events_stored": stored,
                },
            )
        )

    if "storm" in fleet.failed:
        for fig in storm_failed(sizes, fleet):
            emit(fig)
        return
    lost, dup, checked = verify_storm(ctl, fleet.storm_reports)
    log(f"  storm: {checked} events checked in the store: {lost} lost, {dup} duplicated")
    detail = {
        "agents": sizes.storm_agents,
        "unacked_at_kill": fleet.storm_unacked_at_kill,
        "controller_restart_s": fleet.restart_s,
        "bare_restart_s": bare.restart_s,
        "event_interval_s": sizes.storm_event_interval,
        "client_errors": json.dumps(fleet.storm_errors),
        "client_failed_after_ready": json.dumps(fleet.storm_failed_after_ready),
        "bare_client_failed_after_ready": json.dumps(bare.storm_failed_after_ready),
        "controller_open_fds_after": fleet.fds_after_storm,
    }
    emit(
        Figure(
            "storm.reattach_seconds",
            fleet.reattach_s,
            "s",
            bare.reattach_s,
            storm_target(sizes.storm_agents),
            fleet.reattach_s <= STORM_TARGET_S,
            detail=detail,
        )
    )
    emit(Figure("storm.events_lost", lost, "events", 0, "== 0", lost == 0, detail={"checked": checked}))
    emit(Figure("storm.events_duplicated", dup, "events", 0, "== 0", dup == 0, detail={"checked": checked}))
    if fleet.node_list is not None:
        emit(node_list_figure(sizes.storm_agents, fleet.node_list))


def verify_storm(ctl: Controller, reports: dict[str, list[int]]) -> tuple[int, int, int]:
    """Every periodic event an agent made is in the store exactly once, under the seq it was given."""
    with ctl.db() as db:
        rows = db.execute(
            "SELECT node, seq, json_extract(body, '$.message') FROM events WHERE step='custom-storm'"
        ).fetchall()
    return count_storm(rows, reports)


def count_storm(rows: list[tuple[str, int, str]], reports: dict[str, list[int]]) -> tuple[int, int, int]:
    """(lost, duplicated, checked) from the stored (node, seq, message) rows of the periodic events
    and what each agent reports it made (its first seq, its count)."""
    lost = dup = checked = 0
    by_node: dict[str, dict[int, int]] = {}
    for node, seq, message in rows:
        k = int(str(message).split()[1])
        seen = by_node.setdefault(node, {})
        if k in seen:
            dup += 1
        seen[k] = seq
    for node, (first, count, _next) in reports.items():
        seen = by_node.get(node, {})
        checked += count
        lost += sum(1 for k in range(count) if seen.get(k) != first + k)
        dup += sum(1 for k in seen if k >= count)
    return lost, dup, checked


# -- one agent flooding output ---------------------------------------------------------------------

FLOOD_LINES = 500  # lines per output event: the most the agent's runner puts in one
FLOOD_WINDOW_EVENTS = 64  # events the flooding agent keeps ahead of its acknowledgements (about 3 MB)
FLOOD_TARGET = 2.0  # the others' heartbeat round-trip p99, flooded / unloaded
FLOOD_ROUNDS = 3  # quiet and flooded windows, interleaved


def probe_window(fleet: Sims, seconds: float) -> list[float]:
    """Round trips (ms) of the probes that came back within ``seconds``."""
    fleet.call({"cmd": "probe", "collect": True})
    time.sleep(seconds)
    return [1000 * r for reply in fleet.call({"cmd": "probe", "collect": True}) for r in reply["rtts"]]


def enroll_all(work: Path, ctl: Controller, label: str, count: int, token: str) -> list[str]:
    """Enroll ``count`` simulated agents for real (waiting out the enrollment rate); their id files."""
    nsims = Sims.needed(count)
    parts = split(names(label, count), nsims)
    files = [str(work / "identities" / f"{label}-{i}.jsonl") for i in range(nsims)]
    sims = Sims(work, f"{label}-enroll", nsims)
    try:
        sims.call(lambda i: {"cmd": "prepare_enroll", "names": parts[i]})
        replies = sims.call(
            lambda i: {
                "cmd": "enroll",
                "target": ctl.address,
                "ca": str(ctl.ca_file),
                "token": token,
                "concurrency": ENROLL_CONCURRENCY,
                "retry_exhausted": True,
                "out": files[i],
            },
            timeout=1800,
        )
    finally:
        sims.close()
    ok, _ = enroll_span(replies)
    if ok != count:
        raise RuntimeError(f"{label}: {ok} of {count} agents enrolled")
    return files


@dataclass
class FloodResult:
    quiet: list[float] = field(default_factory=list)  # round trips (ms), nobody flooding
    loud: list[float] = field(default_factory=list)  # round trips (ms), one agent flooding
    quiet_cpu: float = 0.0
    loud_cpu: float = 0.0
    flood_lines_per_s: float = 0.0
    flooder_cpu: float = 0.0  # the flooding client's CPU % (it shares the client core with the fleet)
    flood_errors: dict[str, int] = field(default_factory=dict)
    fleet_errors: dict[str, int] = field(default_factory=dict)


def run_flood(work: Path, sizes: Sizes, emit: Emit) -> None:
    """2,000 agents heartbeat; their round-trip p99 without, then with, one agent flooding output."""
    (work / "flood" / "identities").mkdir(parents=True, exist_ok=True)
    ctl = Controller(work / "flood", sizes.heartbeat)
    n = sizes.flood_agents
    try:
        ctl.start()
        log(f"flood: controller on {ctl.address}, {n} agents heartbeating every {sizes.heartbeat}s")
        ctl.apply(messages.environment_yaml(messages.BENCH_ENV, messages.BENCH_STEPS))
        token = ctl.token(messages.BENCH_ENV, uses=n + 10)
        files = enroll_all(ctl.work, ctl, "flood", n, token)
        flooder_files = enroll_all(ctl.work, ctl, "flooder", 1, token)
        fleet = Sims(ctl.work, "flood-fleet", len(files))
        flooder = Sims(ctl.work, "flooder", 1)
        try:
            fleet.call(lambda i: {"cmd": "load", "files": [files[i]]})
            flooder.call({"cmd": "load", "files": flooder_files})
            result = measure_flood(ctl, sizes, fleet, flooder)
        finally:
            flooder.close()
            fleet.close()
        emit(flood_figure(sizes, result))
    except Exception as exc:
        failure = {"error": _failure(exc)}
        emit(Figure("flood.heartbeat_rtt_p99_ms", None, "ms", None, "", False, detail=failure))
    finally:
        ctl.stop()


class Usage:
    """Seconds, controller CPU seconds, and the flooder's CPU and acknowledged lines, summed over
    every ``with`` block."""

    def __init__(self, ctl: Controller, flooder: Sims | None = None) -> None:
        self.ctl, self.flooder = ctl, flooder
        self.seconds = self.cpu = self.flooder_cpu = self.lines = 0.0

    def _sample(self) -> tuple[float, float, float, float]:
        if self.flooder is None:
            return time.monotonic(), self.ctl.p.cpu_seconds(), 0.0, 0.0
        lines = float(self.flooder.stats()["lines_acked"])
        return time.monotonic(), self.ctl.p.cpu_seconds(), self.flooder.procs[0].cpu_seconds(), lines

    def __enter__(self) -> None:
        self._start = self._sample()

    def __exit__(self, *exc: object) -> None:
        end = self._sample()
        self.seconds += end[0] - self._start[0]
        self.cpu += end[1] - self._start[1]
        self.flooder_cpu += end[2] - self._start[2]
        self.lines += end[3] - self._start[3]

    @property
    def controller_pct(self) -> float:
        return 100 * self.cpu / self.seconds if self.seconds else 0.0

    @property
    def flooder_pct(self) -> float:
        return 100 * self.flooder_cpu / self.seconds if self.seconds else 0.0

    @property
    def lines_per_s(self) -> float:
        return self.lines / self.seconds if self.seconds else 0.0


def measure_flood(ctl: Controller, sizes: Sizes, fleet: Sims, flooder: Sims) -> FloodResult:
    """Quiet and flooded windows interleaved (``FLOOD_ROUNDS`` of each, the flooder connected all
    along), so drift over the run (the store growing, the machine's other load) falls on both."""
    out = FloodResult()
    n = sizes.flood_agents
    connect(fleet, ctl, bare=False, provision=True)
    fleet.wait(
        "flood: every agent streaming and provisioned",
        lambda s: s["streaming"] == n and s["provisioned"] == n,
        timeout=n / 25 + 120,
    )
    connect(flooder, ctl, bare=False, provision=False)
    flooder.wait("flood: the flooding agent streaming", lambda s: s["streaming"] == 1, 120)
    fleet.call({"cmd": "probe", "on": True})
    time.sleep(sizes.heartbeat + 1)  # every agent has had a heartbeat with a probe
    window = sizes.flood_window / FLOOD_ROUNDS
    quiet, loud = Usage(ctl), Usage(ctl, flooder)
    for _ in range(FLOOD_ROUNDS):
        with quiet:
            out.quiet += probe_window(fleet, window)
        flooder.call({"cmd": "flood", "lines_per_event": FLOOD_LINES, "window": FLOOD_WINDOW_EVENTS})
        time.sleep(1)  # the flood under way
        with loud:
            out.loud += probe_window(fleet, window)
        flooder.call({"cmd": "flood", "on": False})
        time.sleep(QUOTA_PAUSE_SECONDS + 1)  # its last batches read (a node over its quota waits)
    out.quiet_cpu, out.loud_cpu = quiet.controller_pct, loud.controller_pct
    out.flooder_cpu, out.flood_lines_per_s = loud.flooder_pct, loud.lines_per_s
    out.flood_errors = flooder.stats()["errors"]
    out.fleet_errors = fleet.stats()["errors"]
    return out


def flood_figure(sizes: Sizes, r: FloodResult) -> Figure:
    q99, l99 = p99(r.quiet), p99(r.loud)
    ratio = l99 / q99 if q99 else None
    log(
        f"  flood: heartbeat round trip p99 {q99:.1f} ms unloaded ({len(r.quiet)} probes), "
        f"{l99:.1f} ms with one agent flooding {r.flood_lines_per_s:.0f} lines/s ({len(r.loud)} probes)"
    )
    return Figure(
        "flood.heartbeat_rtt_p99_ms",
        l99,
        "ms",
        q99,
        f"ratio <= {FLOOD_TARGET:g} (flooded / unloaded, {sizes.flood_agents} agents)",
        ratio is not None and ratio <= FLOOD_TARGET and len(r.loud) > 0,
        ratio=ratio,
        detail={
            "agents": sizes.flood_agents,
            "heartbeat_seconds": sizes.heartbeat,
            "window_s": sizes.flood_window,
            "rounds": FLOOD_ROUNDS,
            "probes_unloaded": len(r.quiet),
            "probes_flooded": len(r.loud),
            "p50_unloaded_ms": statistics.median(r.quiet) if r.quiet else None,
            "p50_flooded_ms": statistics.median(r.loud) if r.loud else None,
            "flood_lines_acked_per_s": r.flood_lines_per_s,
            "flood_lines_per_event": FLOOD_LINES,
            "flood_client_errors": json.dumps(r.flood_errors),
            "fleet_client_errors": json.dumps(r.fleet_errors),
            "controller_cpu_pct_unloaded": r.quiet_cpu,
            "controller_cpu_pct_flooded": r.loud_cpu,
            "flooding_client_cpu_pct": r.flooder_cpu,
            "what": "heartbeat, then a one-event batch on the same stream; round trip = until its ack",
        },
    )


__all__ = ["FULL", "MAX_AGENTS_PER_SIM", "QUICK", "Sizes", "run_bare", "run_controller", "run_flood"]
