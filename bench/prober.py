"""An admin probing the controller with ``tetherctl node list`` while its fleet reconnects.

Each probe does what ``tetherctl node list`` does: a fresh mutual-TLS connection from the
controller's admin.conf (the admin's own certificate, the SDK's ``connection.secure_channel``),
then ``ListNodes`` at the CLI's page size (``paging.MAX_PAGE_SIZE``, 1,000 nodes) with the CLI's
default deadline (30 s), then the connection is closed. A storm probe fetches the first page
only (one admin call; a page of 1,000 nodes costs the controller about 60 ms of CPU, so whole
lists of 15,000 nodes, 15 pages, over and over would load the server they measure); ``full``
fetches every page, the whole list as an operator waits for it.

One probe at a time: the next starts ``interval`` seconds after the previous one started, or as
soon as it ended if it took longer. Times are ``time.monotonic()`` (CLOCK_MONOTONIC, one clock
for every process of the machine, so the coordinator can place them around a kill and a restart).
The prober runs on the clients' core with a raised priority (niceness -10 where allowed): in a
storm that core is saturated by the simulated agents' handshakes, which are not the server's
delay.

Driven by JSON commands on stdin, one reply per command on stdout:

    {"cmd": "start", "interval": 1.0}   start probing (first pages)
    {"cmd": "stop"}                     stop (after the probe under way); the probes since start
    {"cmd": "full"}                     one whole list now (every page): {"probe": PROBE}
    {"cmd": "quit"}

A probe is ``[t0, t1, error, nodes, pages]``; ``error`` is "" or the failure (a status code's name).

    python -m bench.prober ADMIN_CONF

The coordinator's side: ``AdminProber`` (the process), ``Probe``, ``StormProbes`` and
``node_list_figure`` (the figure ``storm.node_list_p99_ms``).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench.common import BIN, CLIENT_CPUS, Figure, Proc
from bench.stats import p99
from tether.controller import paging
from tether.controller.adminconf import AdminConfig
from tether.controller.client import Client, connection, pages
from tether.controller.client.api import DEFAULT_TIMEOUT
from tether.controller.client.errors import ApiError
from tether.v1 import admin_pb2

PRIORITY = -10  # the niceness the prober asks for
# Seconds between the starts of two probes. A page of 1,000 nodes costs the controller about 60 ms
# of CPU on its event loop (more on a loaded core): one a second is ~6 % of the server's core, a
# cost the reconnect storm it measures shares (one every 0.1-0.2 s would be 30-60 %).
INTERVAL = 1.0
TARGET_MS = 1000.0  # an admin call answers within a second while the fleet reconnects
MIN_WINDOW_S = 10.0  # probed at least this long after the restart is ready (a quick storm is shorter)
PAGE_SIZE = paging.MAX_PAGE_SIZE  # what tetherctl node list asks for


# -- the probing process ----------------------------------------------------------------------------


def node_list(conf: AdminConfig, *, max_pages: int = 0, timeout: float = DEFAULT_TIMEOUT) -> tuple[int, int]:
    """``tetherctl node list`` (its first ``max_pages`` pages; 0: all) over a fresh connection;
    (nodes, pages) received."""
    client = Client(connection.secure_channel(conf), timeout=timeout, address=conf.controller)
    got = [0, 0]

    def fetch(token: str) -> admin_pb2.ListNodesResponse:
        request = admin_pb2.ListNodesRequest(page_size=PAGE_SIZE, page_token=token)
        reply = client.call(client.stub.ListNodes, request)
        got[0] += len(reply.nodes)
        got[1] += 1
        return reply

    try:
        for _ in pages.pages(fetch):
            if max_pages and got[1] >= max_pages:
                break
    finally:
        client.close()
    return got[0], got[1]


def error_name(exc: BaseException) -> str:
    cause = exc.__cause__ if isinstance(exc, ApiError) else exc
    if isinstance(cause, grpc.RpcError) and hasattr(cause, "code"):
        return str(cause.code().name)
    return type(exc).__name__


def timed(conf: AdminConfig, max_pages: int) -> list[Any]:
    t0 = time.monotonic()
    error, nodes, npages = "", 0, 0
    try:
        nodes, npages = node_list(conf, max_pages=max_pages)
    except Exception as exc:
        error = error_name(exc)
    return [t0, time.monotonic(), error, nodes, npages]


class Loop:
    """Probes (first pages) one at a time in a thread until stopped."""

    def __init__(self, conf: AdminConfig) -> None:
        self.conf = conf
        self.done: list[list[Any]] = []
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, interval: float) -> None:
        self.stop()
        self.done = []
        self.stopping.clear()
        self.thread = threading.Thread(target=self.run, args=(interval,), daemon=True)
        self.thread.start()

    def stop(self) -> list[list[Any]]:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        return self.done

    def run(self, interval: float) -> None:
        while not self.stopping.is_set():
            probe = timed(self.conf, max_pages=1)
            self.done.append(probe)
            self.stopping.wait(max(0.0, probe[0] + interval - time.monotonic()))


def main() -> int:
    conf = connection.read_admin_conf(sys.argv[1])
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, PRIORITY)
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    loop = Loop(conf)
    for raw in sys.stdin:
        cmd = json.loads(raw)
        name = cmd.get("cmd")
        reply: dict[str, Any]
        if name == "start":
            loop.start(float(cmd.get("interval", INTERVAL)))
            reply = {"started": True, "niceness": niceness}
        elif name == "stop":
            reply = {"probes": loop.stop()}
        elif name == "full":
            reply = {"probe": timed(conf, max_pages=0)}
        elif name == "quit":
            loop.stop()
            reply = {"bye": True}
        else:
            reply = {"error": f"unknown command {name}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
        if name == "quit":
            break
    return 0


# -- the coordinator's side -------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    t0: float  # monotonic, when it began
    t1: float  # when it returned (or failed)
    error: str  # "" or why it failed
    nodes: int
    pages: int

    @property
    def ms(self) -> float:
        return 1000 * (self.t1 - self.t0)

    @staticmethod
    def of(raw: list[Any]) -> Probe:
        return Probe(float(raw[0]), float(raw[1]), str(raw[2]), int(raw[3]), int(raw[4]))


class AdminProber:
    """The prober process (``python -m bench.prober``), on the clients' core."""

    def __init__(self, admin_conf: Path, log_path: Path) -> None:
        self.proc = Proc(
            [str(BIN / "python"), "-m", "bench.prober", str(admin_conf)],
            cpus=CLIENT_CPUS,
            log_path=log_path,
            stdin=True,
        )
        self.niceness = 0
        self.interval = INTERVAL

    def _call(self, cmd: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
        self.proc.send(cmd)
        reply: dict[str, Any] = json.loads(self.proc.readline(timeout))
        if "error" in reply:
            raise RuntimeError(f"prober: {reply['error']} (log: {self.proc.log_path})")
        return reply

    def start(self, interval: float = INTERVAL) -> None:
        self.niceness = int(self._call({"cmd": "start", "interval": interval})["niceness"])
        self.interval = interval

    def stop(self) -> list[Probe]:
        return [Probe.of(p) for p in self._call({"cmd": "stop"})["probes"]]

    def full(self) -> Probe:
        return Probe.of(self._call({"cmd": "full"})["probe"])

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.proc.alive():
                self._call({"cmd": "quit"}, timeout=60)
        self.proc.kill()


def summary(probes: list[Probe]) -> dict[str, Any]:
    """Count, failures and latency (every probe at the time it took, failed or not)."""
    ms = [p.ms for p in probes]
    return {
        "count": len(probes),
        "errors": sum(1 for p in probes if p.error),
        "p50_ms": statistics.median(ms) if ms else None,
        "p99_ms": p99(ms) if ms else None,
        "max_ms": max(ms) if ms else None,
    }


@dataclass
class StormProbes:
    """The prober's probes around one kill -9 and restart (monotonic times)."""

    kill: float = 0.0
    ready: float = 0.0  # the restarted server printed "listening on"
    reattached: float = 0.0  # the last agent's Welcome (the end, where not every agent came back)
    complete: bool = True  # every agent re-attached
    end: float = 0.0  # the prober stopped
    quiet: list[Probe] = field(default_factory=list)  # before the kill: fleet connected, events flowing
    storm: list[Probe] = field(default_factory=list)  # from the kill to the end
    full_list: Probe | None = None  # one whole list (every page), before the kill
    interval: float = INTERVAL
    niceness: int = 0

    @property
    def while_down(self) -> list[Probe]:
        """Probes begun before the restarted server was ready (they may fail: nothing listens)."""
        return [p for p in self.storm if p.t0 < self.ready]

    @property
    def after_ready(self) -> list[Probe]:
        return [p for p in self.storm if p.t0 >= self.ready]

    @property
    def until_reattached(self) -> list[Probe]:
        return [p for p in self.after_ready if p.t0 <= self.reattached]


def node_list_target(agents: int) -> str:
    return (
        f"<= {TARGET_MS:g} ms, 0 failed once restarted: an admin's call answers within"
        f" {TARGET_MS / 1000:g} s while {agents} agents reconnect (first page, {PAGE_SIZE} nodes)"
    )


def node_list_figure(agents: int, r: StormProbes) -> Figure:
    """``storm.node_list_p99_ms``: the p99 of the first page of ``tetherctl node list`` from the
    restart being ready to the end of the window; baseline the same before the kill."""
    after, quiet = summary(r.after_ready), summary(r.quiet)
    early, down = summary(r.until_reattached), r.while_down
    value, base = after["p99_ms"], quiet["p99_ms"]
    errors = Counter(p.error for p in r.after_ready if p.error)
    full = r.full_list
    return Figure(
        "storm.node_list_p99_ms",
        value,
        "ms",
        base,
        node_list_target(agents),
        value is not None and value <= TARGET_MS and after["errors"] == 0,
        detail={
            "what": (
                "tetherctl node list as the admin: a fresh mTLS connection, then ListNodes "
                f"page_size {PAGE_SIZE} (the CLI's), the first page; one probe at a time, "
                f"one every {r.interval:g} s; latency counts failed probes too"
            ),
            "window": (
                "from the restarted controller listening until every agent re-attached, "
                f">= {MIN_WINDOW_S:g} s"
            ),
            "baseline": "the same probe before the kill (fleet connected, events flowing)",
            "agents": agents,
            "probes": after["count"],
            "errors": after["errors"],
            "error_codes": json.dumps(dict(errors)),
            "p50_ms": after["p50_ms"],
            "max_ms": after["max_ms"],
            "nodes_per_page": max((p.nodes for p in r.after_ready), default=0),
            "window_s": r.end - r.ready,
            "reattached_after_ready_s": r.reattached - r.ready if r.complete else None,
            "every_agent_reattached": r.complete,
            "probes_until_reattached": early["count"],
            "p99_until_reattached_ms": early["p99_ms"],
            "probes_while_down": len(down),
            "failed_while_down": sum(1 for p in down if p.error),
            "down_s": r.ready - r.kill,
            "quiet_probes": quiet["count"],
            "quiet_errors": quiet["errors"],
            "quiet_p50_ms": quiet["p50_ms"],
            "full_list_ms": full.ms if full else None,
            "full_list_nodes": full.nodes if full else None,
            "full_list_pages": full.pages if full else None,
            "full_list_error": full.error if full else None,
            "prober_niceness": r.niceness,
        },
    )


if __name__ == "__main__":
    sys.exit(main())
