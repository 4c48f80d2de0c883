"""What the controller spends per connected agent, against the bare gRPC server (issue 16).

Each measurement runs the real controller (``tether.controller.server.Controller``: its SQLite
store, hub, node watch, progress, drift watch, the lot) beside the bare baseline
(``bench/bare.py``'s ``Bare``) on the same transport:

``memory``  N agents connect, each over its own mutual-TLS connection with its own certificate
            (signed by the controller's CA, its node record in the store), to a server in a child
            process: hello, Welcome/Settings/Plan, one batch of step events, its Ack (``--beat S``:
            then S seconds of heartbeats). Prints the server's RSS idle and with every agent
            connected, KiB per agent, and where it went (mappings, malloc and pymalloc in use,
            SQLite). ``--trace`` runs the servers under tracemalloc and prints the allocation sites
            that grew per stream (Python's allocator only: gRPC core, BoringSSL and protobuf's
            upb arenas allocate with malloc). ``--bare-plan real``: the bare server answers with
            the plan the controller sends (35 KB) instead of bench/bare.py's (529 bytes).
``cpu``     the same fleet heartbeating (the bench's 200-byte health report) every
            ``--heartbeat`` seconds; the server's CPU per heartbeat over ``--windows`` windows of
            ``--window`` seconds (every thread: /proc/PID/stat), controller against bare.
``ops``     in-process, no gRPC: CPU of one heartbeat through ``AgentService._read``, of one
            health save written together with the others due (``HealthSaver.flush``) and of one
            written alone (as each stream did before); ``--callgrind``: instructions instead.
``paced``   in-process: streams heartbeating in real time, process CPU per heartbeat with the
            saves written together, alone, or not at all.

    .venv/bin/python scripts/stream_memory.py memory --agents 2000 [--beat 12 --heartbeat 2]
    .venv/bin/python scripts/stream_memory.py memory --agents 1000 --trace --top 30 --server controller
    .venv/bin/python scripts/stream_memory.py cpu --agents 2000 --heartbeat 2 --window 20
    .venv/bin/python scripts/stream_memory.py ops --streams 500 --beats 20 --rounds 7 [--callgrind]
    .venv/bin/python scripts/stream_memory.py paced --streams 2000 --heartbeat 2 --persist 12

``--pin`` puts the server on CPU 0 and this process (the agents) on CPU 1, as ``bench/run.py``.
Environment: ``STREAM_MEMORY_WRAP`` prefixes the server's command (e.g. ``valgrind
--tool=massif``; with ``STREAM_MEMORY_MASSIF_DIR`` a detailed snapshot is taken idle and
connected, through vgdb); ``STREAM_MEMORY_SAVE_ALONE=1`` makes the controller write each health
report alone, as before; ``STREAM_MEMORY_PERSIST_SECONDS`` sets ``HEALTH_PERSIST_SECONDS``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "proto"))  # the tether package

import grpc  # noqa: E402

from bench import messages  # noqa: E402
from tether.controller.ca import CertificateAuthority  # noqa: E402
from tether.controller.config import ControllerConfig  # noqa: E402
from tether.controller.store.records import NodeRecord  # noqa: E402
from tether.nodeagent import wire  # noqa: E402
from tether.nodeagent.identity import CONTROLLER_SERVER_NAME, generate_key, make_csr  # noqa: E402
from tether.nodeagent.model import now_ms  # noqa: E402

pb = wire.pb
TRACE_FRAMES = 10
CONNECTING = 64  # handshakes in flight (bench/sim.py: 64 per client process)
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.enable_retries", 0),
    ("grpc.ssl_target_name_override", CONTROLLER_SERVER_NAME),
    ("grpc.use_local_subchannel_pool", 1),  # one connection per agent
]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the fleet's identities and node records --------------------------------------------------


def _keep(record: NodeRecord) -> Any:
    """``enroll_node``'s decision: store ``record``, no token used."""
    return lambda token, existing: (record, False)


async def _prepare(work: Path, agents: int) -> list[tuple[str, bytes, bytes]]:
    """A controller data dir with the bench environment and ``agents`` node records, each with a
    certificate of its own; returns (name, key PEM, certificate PEM) per node."""
    from tether.controller.server import Controller
    from tether.controller.spec import load_document

    config = ControllerConfig(data_dir=work / "controller", listen="127.0.0.1:0")
    ctl = Controller(config)
    app = await ctl.start()
    try:
        doc = messages.environment_yaml(messages.BENCH_ENV, messages.BENCH_STEPS)
        loaded = load_document(doc)
        await app.store.put_environment(messages.BENCH_ENV, doc, loaded.api_version, loaded.normalized)
        fleet: list[tuple[str, bytes, bytes]] = []
        writes = []
        for i in range(agents):
            name = f"bench-{i:05d}"
            key = generate_key()
            issued = app.ca.sign_node_csr(make_csr(key, name), name, 30)
            record = NodeRecord(
                name=name,
                environment=messages.BENCH_ENV,
                role="worker",
                cert_fingerprint=issued.fingerprint,
                key_hash="",
                token_id="bench",  # noqa: S106 (a token's id, not a secret)
                enrolled_ms=now_ms(),
            )
            writes.append(app.store.enroll_node("bench", name, _keep(record)))
            fleet.append((name, key, issued.cert_pem))
            if len(writes) >= 256:
                await asyncio.gather(*writes)
                writes = []
        await asyncio.gather(*writes)
        # The plan the controller sends these nodes (its steps rendered: about 35 KB), for
        # ``--bare-plan real``: bench/bare.py answers with a plan of 529 bytes.
        from tether.controller.agent_service import AgentService

        service = AgentService(app)
        node = app.store.get_node(fleet[0][0])
        assert node is not None
        plan = await service.render_plan(node, messages.node_facts(node.name))
        (work / "plan.bin").write_bytes(service.plan_message(plan).SerializeToString())
    finally:
        await ctl.stop()
    return fleet


# -- the server, in a child process ----------------------------------------------------------


def _proc_cpu_s(pid: int | str = "self") -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _maps_kib() -> dict[str, int]:
    """RSS by kind of mapping: the main malloc heap; anonymous memory by size: 1 MiB (Python's
    arenas), 8 MiB (thread stacks), 8-64 MiB (malloc's per-thread arenas), other (large
    blocks); files (code, SQLite's shared memory)."""
    out = {"heap": 0, "anon": 0, "anon_1m": 0, "anon_8m": 0, "anon_64m": 0, "file": 0, "stack": 0}
    kind = "anon"
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if not head:
            continue
        if "-" in head[0] and not head[0].endswith(":"):
            name = head[5] if len(head) > 5 else ""
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            size = hi - lo
            if name == "[heap]":
                kind = "heap"
            elif name.startswith("[stack"):
                kind = "stack"
            elif name.startswith("/"):
                kind = "file"
            elif size == 1 << 20:
                kind = "anon_1m"
            elif abs(size - (8 << 20)) <= 4096:
                kind = "anon_8m"
            elif 8 << 20 < size <= 64 << 20:
                kind = "anon_64m"
            else:
                kind = "anon"
        elif head[0] == "Rss:":
            out[kind] += int(head[1])
    return out


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _alloc_kib() -> dict[str, int]:
    """Bytes in use (KiB) by allocator: malloc (every arena: gRPC core, OpenSSL, upb, SQLite and
    Python's blocks over 512 bytes), SQLite alone, pymalloc's small blocks."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    libc.fopen.restype = ctypes.c_void_p
    info = libc.mallinfo2()
    out = {"malloc_used": (info.uordblks + info.hblkhd) // 1024, "malloc_free": info.fordblks // 1024}
    with contextlib.suppress(OSError, AttributeError):
        lib = ctypes.CDLL("libsqlite3.so.0")
        lib.sqlite3_memory_used.restype = ctypes.c_int64
        out["sqlite_used"] = lib.sqlite3_memory_used() // 1024
    with tempfile.NamedTemporaryFile("w+") as f:  # malloc_info: each arena's size (XML)
        fp = libc.fopen(f.name.encode(), b"w")
        libc.malloc_info(0, ctypes.c_void_p(fp))
        libc.fclose(ctypes.c_void_p(fp))
        text = Path(f.name).read_text()
        heaps = re.findall(r'<heap nr="(\d+)">.*?<system type="current" size="(\d+)"/>', text, re.S)
        out["malloc_arenas"] = len(heaps)
        out["malloc_arena_kib"] = sum(int(size) for _, size in heaps) // 1024
    with tempfile.TemporaryFile("w+") as f:  # sys._debugmallocstats writes to C's stderr
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        for line in f:
            if line.startswith("# bytes in allocated blocks"):
                out["pymalloc_used"] = int(line.split("=")[1].replace(",", "")) // 1024
            elif line.startswith("# arenas allocated current"):
                out["pymalloc_arenas"] = int(line.split("=")[1].replace(",", ""))
    return out


def _rss_kib(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def _start_server(kind: str, work: Path, heartbeat: int, real_plan: bool) -> tuple[int, Any]:
    """(port, stop coroutine function) of the controller or the bare server on 127.0.0.1."""
    if kind == "controller":
        from tether.controller.server import GC_THRESHOLDS, Controller
        from tether.nodeagent import logs

        if os.environ.get("STREAM_MEMORY_SAVE_ALONE"):
            _save_alone()
        if os.environ.get("STREAM_MEMORY_PERSIST_SECONDS"):  # saves more often than once a minute
            from tether.controller import agent_service

            agent_service.HEALTH_PERSIST_SECONDS = float(os.environ["STREAM_MEMORY_PERSIST_SECONDS"])

        logs.configure("info")  # its log lines go to stderr (a file), as in production
        ctl = Controller(
            ControllerConfig(data_dir=work / "controller", listen="127.0.0.1:0", heartbeat_seconds=heartbeat)
        )
        await ctl.start()
        gc.freeze()  # as tether.controller.server.serve
        gc.set_threshold(*GC_THRESHOLDS)
        return int(ctl.address.rsplit(":", 1)[1]), ctl.stop

    from bench.bare import Bare
    from tether.controller.transport import SERVER_OPTIONS
    from tether.nodeagent import anonymous

    ca = CertificateAuthority.load_or_create(work / "controller" / "pki")
    key_pem, chain_pem = ca.server_credentials(["127.0.0.1"])
    creds = grpc.ssl_server_credentials(
        [(key_pem, chain_pem)], root_certificates=ca.cert_pem + anonymous.CERT_PEM, require_client_auth=True
    )
    bare = Bare(heartbeat, b"")
    if real_plan:
        bare.replies = {**bare.replies, "plan": (work / "plan.bin").read_bytes()}
    handler = grpc.method_handlers_generic_handler(
        "tether.v1.AgentService", {"Connect": grpc.stream_stream_rpc_method_handler(bare.connect)}
    )
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()

    async def stop() -> None:
        await server.stop(1)

    return port, stop


def _save_alone() -> None:
    """Health reports written one at a time, each as it becomes due (as before HealthSaver): to
    compare the CPU of the two in a fleet (STREAM_MEMORY_SAVE_ALONE=1)."""
    from tether.controller.agent_service import HealthSaver, plain

    def due(self: HealthSaver, session: Any) -> None:
        session.health_saved = session.last_seen
        health = session.health
        if health is not None:
            write = self.app.store.update_node(session.node, health=plain(health), last_seen_ms=now_ms())
            task = asyncio.ensure_future(write)
            _PENDING.add(task)
            task.add_done_callback(_PENDING.discard)

    HealthSaver.due = due  # type: ignore[method-assign]


_PENDING: set[asyncio.Future[Any]] = set()


def _top(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, streams: int, limit: int) -> list[str]:
    """The sites that grew, per stream: by the innermost frame of our code or the stdlib."""
    keep = [
        tracemalloc.Filter(False, tracemalloc.__file__),
        tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
    ]
    a, b = before.filter_traces(keep), after.filter_traces(keep)
    lines: list[str] = []
    total = sum(s.size_diff for s in b.compare_to(a, "filename"))
    lines.append(
        f"python allocations grown: {total / 1024 / streams:.2f} KiB per stream ({total / 1048576:.1f} MiB)"
    )
    lines.append("-- by line (innermost frame) --")
    for s in b.compare_to(a, "lineno")[:limit]:
        frame = s.traceback[-1]
        lines.append(
            f"{s.size_diff / streams:8.0f} B {s.count_diff / streams:6.2f} blocks/stream  "
            f"{_short(frame.filename)}:{frame.lineno}"
        )
    lines.append("-- by call stack (the first frames of our code shown) --")
    for s in b.compare_to(a, "traceback")[:limit]:
        frames = list(reversed(s.traceback))  # the innermost first
        ours = [f for f in frames if "/tether/" in f.filename or "/controller/" in f.filename]
        shown = ours[:3] or frames[:2]
        where = " <- ".join(f"{_short(f.filename)}:{f.lineno}" for f in shown)
        inner = frames[0]
        lines.append(
            f"{s.size_diff / streams:8.0f} B {s.count_diff / streams:6.2f}/stream  "
            f"{_short(inner.filename)}:{inner.lineno}  [{where}]"
        )
    return lines


def _short(path: str) -> str:
    for marker in ("/site-packages/", "/lib/python3", "/work/main/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


async def _serve_child(args: argparse.Namespace) -> None:
    if args.trace:
        tracemalloc.start(TRACE_FRAMES)
    port, stop = await _start_server(args.kind, Path(args.work), args.heartbeat, args.bare_plan == "real")
    snaps: dict[str, tracemalloc.Snapshot] = {}
    print(f"port {port}", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
        if not line or line[0] == "quit":
            break
        reply: dict[str, Any] = {}
        if line[0] == "mark":
            reply = {
                "rss_kib": _rss_kib(),
                "cpu_s": _proc_cpu_s(),
                "threads": len(os.listdir("/proc/self/task")),
                "maps": _maps_kib(),
                **_alloc_kib(),
            }
        elif line[0] == "reclaim":  # what a full collection, then malloc_trim, give back
            gc.collect()
            collected = _rss_kib()
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            reply = {"rss_kib": collected, "trimmed_kib": _rss_kib()}
        elif line[0] == "snap":
            gc.collect()
            snaps[line[1]] = tracemalloc.take_snapshot()
            reply = {"traced_kib": tracemalloc.get_traced_memory()[0] // 1024, "rss_kib": _rss_kib()}
        elif line[0] == "top":
            reply = {"lines": _top(snaps[line[1]], snaps[line[2]], int(line[3]), int(line[4]))}
        print(json.dumps(reply), flush=True)
    await stop()


class Server:
    """A child process running one server, told what to do on stdin."""

    def __init__(self, kind: str, work: Path, heartbeat: int, *, trace: bool, pin: bool, plan: str) -> None:
        self.kind = kind
        argv = [sys.executable, __file__, "_serve", kind, "--work", str(work), "--heartbeat", str(heartbeat)]
        argv += ["--bare-plan", plan]
        # e.g. STREAM_MEMORY_WRAP="valgrind --tool=massif --massif-out-file=/tmp/massif.%p"
        argv = os.environ.get("STREAM_MEMORY_WRAP", "").split() + argv
        if trace:
            argv.append("--trace")
        self.log = (work / f"{kind}.log").open("a")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, {0})) if pin else None,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("port "):
            raise SystemExit(f"{kind} did not start (see {self.log.name})")
        self.port = int(line.split()[1])

    def massif(self, label: str) -> None:
        """With STREAM_MEMORY_WRAP running valgrind --tool=massif: a detailed snapshot now."""
        out = os.environ.get("STREAM_MEMORY_MASSIF_DIR")
        if out:
            path = f"{out}/{self.kind}.{label}.massif"
            subprocess.run(["vgdb", f"--pid={self.proc.pid}", "detailed_snapshot", path], check=False)

    def ask(self, *words: object) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.proc.stdin.flush()
        reply: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return reply

    def close(self) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# -- the agents --------------------------------------------------------------------------------


def _provision_batch(plan: Any) -> bytes:
    """What bench/sim.py sends for a plan, seq 1 onwards, in one batch."""
    events = [event for event, _ in messages.provision_events(plan)]
    for seq, event in enumerate(events, 1):
        event.seq = seq
    return pb.AgentMessage(events=pb.EventBatch(events=events)).SerializeToString()


class Fleet:
    def __init__(self, ca_pem: bytes, ids: list[tuple[str, bytes, bytes]], heartbeat: float) -> None:
        self.ca_pem = ca_pem
        self.ids = ids
        self.heartbeat = heartbeat
        self.health = messages.health_message().SerializeToString()
        self.connected = 0
        self.beats = 0
        self.beating = asyncio.Event()
        self.errors: dict[str, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._channels: list[grpc.aio.Channel] = []

    async def connect(self, port: int) -> float:
        """Every agent streaming (its plan received, its events acknowledged); seconds taken."""
        gate = asyncio.Semaphore(CONNECTING)
        up = asyncio.Event()
        t0 = time.monotonic()
        self._tasks = [asyncio.create_task(self._agent(port, i, gate, up)) for i in range(len(self.ids))]
        while self.connected + sum(self.errors.values()) < len(self.ids):  # noqa: ASYNC110 (a poll)
            await asyncio.sleep(0.2)
        if self.errors:
            log(f"  errors: {self.errors}")
        return time.monotonic() - t0

    async def _agent(self, port: int, i: int, gate: asyncio.Semaphore, up: asyncio.Event) -> None:
        name, key_pem, cert_pem = self.ids[i]
        creds = grpc.ssl_channel_credentials(self.ca_pem, key_pem, cert_pem)
        try:
            async with gate:
                channel = grpc.aio.secure_channel(f"127.0.0.1:{port}", creds, options=CHANNEL_OPTIONS)
                self._channels.append(channel)
                call: Any = channel.stream_stream(
                    messages.CONNECT,
                    request_serializer=None,
                    response_deserializer=pb.ControllerMessage.FromString,
                )()
                await call.write(messages.hello_message(name, 1, 0).SerializeToString())
                while True:
                    msg = await call.read()
                    if msg is grpc.aio.EOF:
                        raise ConnectionError("stream ended before the plan")
                    if msg.WhichOneof("kind") == "plan":
                        break
                await call.write(_provision_batch(msg.plan))
                while True:
                    msg = await call.read()
                    if msg is grpc.aio.EOF:
                        raise ConnectionError("stream ended before the ack")
                    if msg.WhichOneof("kind") == "ack":
                        break
            self.connected += 1
            await self.beating.wait()
            await asyncio.sleep(random.uniform(0, self.heartbeat))
            while True:
                await call.write(self.health)
                self.beats += 1
                await asyncio.sleep(self.heartbeat)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            key = type(exc).__name__ if not isinstance(exc, grpc.aio.AioRpcError) else exc.code().name
            self.errors[key] = self.errors.get(key, 0) + 1

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in self._channels), return_exceptions=True)


# -- the commands ------------------------------------------------------------------------------


async def _fleet_run(
    args: argparse.Namespace, work: Path, ids: list[tuple[str, bytes, bytes]], kind: str
) -> dict[str, Any]:
    ca_pem = CertificateAuthority.load_or_create(work / "controller" / "pki").cert_pem
    server = Server(kind, work, args.heartbeat, trace=args.trace, pin=args.pin, plan=args.bare_plan)
    fleet = Fleet(ca_pem, ids, args.heartbeat)
    out: dict[str, Any] = {"server": kind}
    try:
        await asyncio.sleep(1)
        idle = server.ask("snap", "idle") if args.trace else server.ask("mark")
        server.massif("idle")
        took = await fleet.connect(server.port)
        await asyncio.sleep(5)  # the last connections' first writes settle (bench/scenarios.py)
        n = fleet.connected
        out.update(agents=n, connect_s=round(took, 1), rss_idle_mib=round(idle["rss_kib"] / 1024, 1))
        if args.command == "memory":
            if args.beat:  # heartbeating for a while first, as in the bench's steady window
                fleet.beating.set()
                await asyncio.sleep(args.beat)
            if args.trace:
                full = server.ask("snap", "connected")
                out["traced_kib_per_agent"] = round((full["traced_kib"] - idle["traced_kib"]) / max(n, 1), 2)
                out["lines"] = server.ask("top", "idle", "connected", max(n, 1), args.top)["lines"]
            else:
                full = server.ask("mark")
            server.massif("connected")
            out["rss_mib"] = round(full["rss_kib"] / 1024, 1)
            out["kib_per_agent"] = round((full["rss_kib"] - idle["rss_kib"]) / max(n, 1), 2)
            if "threads" in full:
                out["threads"] = [idle["threads"], full["threads"]]
                out["malloc_arenas"] = [idle["malloc_arenas"], full["malloc_arenas"]]
                out["pymalloc_arenas"] = [idle["pymalloc_arenas"], full["pymalloc_arenas"]]
            if "maps" in full:
                out["by_mapping_kib_per_agent"] = {
                    k: round((v - idle["maps"][k]) / max(n, 1), 2) for k, v in full["maps"].items()
                }
                out["alloc_kib_per_agent"] = {
                    k: round((full[k] - idle[k]) / max(n, 1), 2)
                    for k in (
                        "malloc_used",
                        "malloc_free",
                        "malloc_arena_kib",
                        "sqlite_used",
                        "pymalloc_used",
                    )
                    if k in full
                }
            if args.reclaim:
                back = server.ask("reclaim")
                out["kib_per_agent_after_gc"] = round((back["rss_kib"] - idle["rss_kib"]) / max(n, 1), 2)
                out["kib_per_agent_after_trim"] = round(
                    (back["trimmed_kib"] - idle["rss_kib"]) / max(n, 1), 2
                )
        else:
            fleet.beating.set()
            await asyncio.sleep(args.heartbeat + 1)  # every agent on its heartbeat
            per_beat: list[float] = []
            for _ in range(args.windows):
                m0, b0 = server.ask("mark"), fleet.beats
                await asyncio.sleep(args.window)
                m1, b1 = server.ask("mark"), fleet.beats
                per_beat.append((m1["cpu_s"] - m0["cpu_s"]) / max(b1 - b0, 1) * 1e6)
            out["cpu_us_per_heartbeat"] = [round(v, 1) for v in per_beat]
            out["median_us"] = round(statistics.median(per_beat), 1)
            out["heartbeats_per_s"] = round((b1 - b0) / args.window)
            out["kib_per_agent"] = round((m1["rss_kib"] - idle["rss_kib"]) / max(n, 1), 2)  # heartbeating
    finally:
        await fleet.close()
        server.close()
    return out


async def fleet_command(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="stream-memory-") as tmp:
        work = Path(tmp)
        log(f"preparing {args.agents} node records and certificates ...")
        ids = await _prepare(work, args.agents)
        kinds = ["controller", "bare"] if args.server == "both" else [args.server]
        results = {}
        for kind in kinds:
            log(f"{kind}: {args.command} with {args.agents} agents ...")
            result = await _fleet_run(args, work, ids, kind)
            for line in result.pop("lines", []):
                print(f"[{kind}] {line}")
            print(json.dumps(result), flush=True)
            results[kind] = result
        if len(results) == 2:
            c, b = results["controller"], results["bare"]
            if args.command == "memory":
                key = "traced_kib_per_agent" if args.trace else "kib_per_agent"
                ratio = c[key] / max(b[key], 1e-9)
                print(f"controller - bare: {c[key] - b[key]:.1f} KiB per agent ({key}); ratio {ratio:.2f}")
            else:
                print(f"heartbeats per CPU-second, controller / bare: {b['median_us'] / c['median_us']:.3f}")


# -- ops: in-process CPU per heartbeat and per health save ---------------------------------------


class _Beats:
    """``count`` copies of a health message, then ``grpc.aio.EOF``, from ``read`` (as
    ``context.read``); parsed once: gRPC's deserializer is not what is measured."""

    def __init__(self, msg: Any, count: int) -> None:
        self.msg, self.left = msg, count

    async def read(self) -> Any:
        if self.left <= 0:
            return grpc.aio.EOF
        self.left -= 1
        return self.msg


@contextlib.asynccontextmanager
async def _attached(prefix: str, streams: int) -> AsyncIterator[tuple[Any, Any, list[tuple[Any, Any]], Any]]:
    """A started controller whose ``streams`` nodes each have their plan and an attached session,
    driven without gRPC: (app, its AgentService, [(node, session)], a heartbeat message)."""
    from tether.controller.agent_service import AgentService
    from tether.controller.server import Controller

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        await _prepare(work, streams)
        ctl = Controller(ControllerConfig(data_dir=work / "controller", listen="127.0.0.1:0"))
        app = await ctl.start()
        pairs: list[tuple[Any, Any]] = []
        try:
            agents = AgentService(app)
            for n in app.store.list_nodes():  # each has its plan, as a connected agent has
                await agents.deliver_plan(n, messages.node_facts(n.name))
            nodes = [n for n in app.store.list_nodes() if not n.revoked]
            pairs = [(n, app.hub.attach(n.name, n.environment)) for n in nodes]
            yield (
                app,
                agents,
                pairs,
                pb.AgentMessage.FromString(messages.health_message().SerializeToString()),
            )
        finally:
            for _, session in pairs:
                app.hub.detach(session)
            await ctl.stop()


async def ops_command(args: argparse.Namespace) -> None:
    from tether.controller import agent_service
    from tether.controller.agent_service import plain

    async with _attached("stream-ops-", args.streams) as (app, agents, pairs, msg):
        agent_service.HEALTH_PERSIST_SECONDS = 1e9  # heartbeats alone (each stream's first is due)
        await asyncio.gather(*(agents._read(n, s, _Beats(msg, 1).read) for n, s in pairs))
        await agents.health.flush()

        async def beats() -> float:
            c0 = time.process_time()
            await asyncio.gather(*(agents._read(n, s, _Beats(msg, args.beats).read) for n, s in pairs))
            return float((time.process_time() - c0) / (args.beats * len(pairs)) * 1e6)

        async def together() -> float:
            for _, s in pairs:
                agents.health.due(s)
            c0 = time.process_time()
            await agents.health.flush()
            return (time.process_time() - c0) / len(pairs) * 1e6

        async def alone() -> float:  # what each stream did before: its own write, awaited
            some = pairs[:100]
            c0 = time.process_time()
            for n, s in some:
                s.report_health(msg.health.SerializeToString(), agent_service._health_from_bytes)
                health = s.health
                assert health is not None
                await app.store.update_node(n.name, health=plain(health), last_seen_ms=now_ms())
            return (time.process_time() - c0) / len(some) * 1e6

        runs: dict[str, list[float]] = {"heartbeat": [], "save_together": [], "save_alone": []}
        mark = os.getppid if args.mark else (lambda: 0)  # under callgrind: a dump per phase
        mark()
        for _ in range(args.rounds):
            runs["heartbeat"].append(await beats())
            mark()
            runs["save_together"].append(await together())
            mark()
            runs["save_alone"].append(await alone())
            mark()
        out: dict[str, Any] = {"streams": len(pairs), "beats_per_round": args.beats * len(pairs)}
        for key, values in runs.items():
            out[f"cpu_us_per_{key}"] = round(statistics.median(values), 2)
            out[f"rounds_{key}"] = [round(v, 1) for v in values]
        print(json.dumps(out))


def ops_callgrind(args: argparse.Namespace) -> None:
    """``ops`` under callgrind: instructions (user space, every thread; not the kernel's fsync)
    per heartbeat, per save written together and per save written alone."""
    from bench import callgrind

    with tempfile.TemporaryDirectory(prefix="stream-ops-cg-") as tmp:
        out = Path(tmp)
        argv = [sys.executable, __file__, "ops", "--mark", "--streams", str(args.streams)]
        argv += ["--beats", str(args.beats), "--rounds", str(args.rounds)]
        subprocess.run(
            callgrind.command(out, argv, marker="getppid"),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        counts = max(callgrind.dumps(out).values(), key=len)
    phases = counts[1 : 1 + 3 * args.rounds]  # after the set-up, before the teardown
    per = {
        "heartbeat": args.beats * args.streams,
        "save_together": args.streams,
        "save_alone": min(100, args.streams),
    }
    result: dict[str, Any] = {"streams": args.streams}
    for i, key in enumerate(per):
        values = [phases[3 * r + i] / per[key] for r in range(args.rounds)]
        result[f"instructions_per_{key}"] = round(statistics.median(values))
        result[f"rounds_{key}"] = [round(v) for v in values]
    print(json.dumps(result))


class _Paced:
    """A health message every ``interval`` seconds (from a random phase) until ``until``."""

    def __init__(self, msg: Any, interval: float, until: float) -> None:
        self.msg, self.interval, self.until = msg, interval, until
        self.next = time.monotonic() + random.uniform(0, interval)
        self.count = 0

    async def read(self) -> Any:
        delay = self.next - time.monotonic()
        if self.next >= self.until:
            return grpc.aio.EOF
        if delay > 0:
            await asyncio.sleep(delay)
        self.next += self.interval
        self.count += 1
        return self.msg


async def paced_command(args: argparse.Namespace) -> None:
    """Streams heartbeating in real time through ``AgentService._read`` (no gRPC): process CPU
    per heartbeat with health saves as the controller makes them (together), one at a time
    (as before), or none; the saves' share of the CPU, their commits shared as they happen."""
    from tether.controller import agent_service

    async with _attached("stream-paced-", args.streams) as (_, agents, pairs, msg):
        saver_due = agent_service.HealthSaver.due
        results: dict[str, list[float]] = {"none": [], "together": [], "alone": []}
        for _ in range(args.rounds):
            for variant in results:
                agent_service.HealthSaver.due = saver_due  # type: ignore[method-assign]
                if variant == "alone":
                    _save_alone()
                agent_service.HEALTH_PERSIST_SECONDS = 1e9 if variant == "none" else args.persist
                for _, s in pairs:
                    s.health_saved = 0.0 if variant != "none" else time.monotonic()
                until = time.monotonic() + args.seconds
                feeds = [_Paced(msg, args.heartbeat, until) for _ in pairs]
                c0 = time.process_time()
                await asyncio.gather(
                    *(agents._read(n, s, f.read) for (n, s), f in zip(pairs, feeds, strict=True))
                )
                await asyncio.sleep(agent_service.HEALTH_FLUSH_SECONDS + 0.5)
                await asyncio.gather(*_PENDING)
                cpu = time.process_time() - c0
                results[variant].append(cpu / sum(f.count for f in feeds) * 1e6)
        agent_service.HealthSaver.due = saver_due  # type: ignore[method-assign]
        out: dict[str, Any] = {
            "streams": len(pairs),
            "heartbeats_per_s": round(len(pairs) / args.heartbeat),
            "saves_per_s": round(len(pairs) / args.persist, 1),
        }
        for key, values in results.items():
            out[f"cpu_us_per_heartbeat_saves_{key}"] = round(statistics.median(values), 2)
            out[f"rounds_{key}"] = [round(v, 1) for v in values]
        print(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("memory", "cpu"):
        s = sub.add_parser(name)
        s.add_argument("--agents", type=int, default=2000)
        s.add_argument("--server", choices=("controller", "bare", "both"), default="both")
        s.add_argument("--heartbeat", type=int, default=30 if name == "memory" else 2)
        s.add_argument("--trace", action="store_true")
        s.add_argument("--top", type=int, default=25)
        s.add_argument("--window", type=float, default=20.0)
        s.add_argument("--windows", type=int, default=3)
        s.add_argument("--pin", action="store_true")
        s.add_argument("--beat", type=float, default=0.0, help="memory: seconds of heartbeats first")
        s.add_argument(
            "--bare-plan",
            choices=("canned", "real"),
            default="canned",
            help="the bare server's plan reply: bench/bare.py's (529 bytes) or the controller's (35 KB)",
        )
        s.add_argument("--reclaim", action="store_true", help="then a full collection and malloc_trim")
    o = sub.add_parser("ops")
    o.add_argument("--streams", type=int, default=500)
    o.add_argument("--beats", type=int, default=40)
    o.add_argument("--rounds", type=int, default=7)
    o.add_argument("--callgrind", action="store_true", help="instructions per operation instead")
    o.add_argument("--mark", action="store_true", help=argparse.SUPPRESS)
    q = sub.add_parser("paced")
    q.add_argument("--streams", type=int, default=2000)
    q.add_argument("--heartbeat", type=float, default=2.0)
    q.add_argument("--persist", type=float, default=12.0, help="seconds between a stream's saves")
    q.add_argument("--seconds", type=float, default=15.0)
    q.add_argument("--rounds", type=int, default=3)
    c = sub.add_parser("_serve")
    c.add_argument("kind", choices=("controller", "bare"))
    c.add_argument("--work", required=True)
    c.add_argument("--heartbeat", type=int, default=30)
    c.add_argument("--trace", action="store_true")
    c.add_argument("--bare-plan", default="canned")
    args = p.parse_args()
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    if args.command == "_serve":
        asyncio.run(_serve_child(args))
    elif args.command == "ops" and args.callgrind:
        ops_callgrind(args)
    elif args.command == "ops":
        asyncio.run(ops_command(args))
    elif args.command == "paced":
        asyncio.run(paced_command(args))
    else:
        if args.pin:
            os.sched_setaffinity(0, {1})
        asyncio.run(fleet_command(args))


if __name__ == "__main__":
    main()
