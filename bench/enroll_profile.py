"""Where an enrollment's CPU goes: the controller (or the bare server) under an enrollment load.

    python -m bench.enroll_profile [--count 2000] [--warmup 300] [--server controller|bare|both]
                                   [--perf] [--no-instrument]

The server is pinned to one core, as in ``bench/run.py``; one simulated-agent process enrolls
``--warmup`` names, then ``--count`` more are measured, each over a fresh mTLS connection,
``ENROLL_CONCURRENCY`` in flight. What is printed is CPU time, not wall-clock rates (other work
shares this machine): per measured enrollment,

- by thread (``/proc/PID/task/*/schedstat``: exact nanoseconds on a CPU), the SQLite writer
  thread named (the instrumented controller reports its native id);
- by function, for the controller (not with ``--no-instrument``): the controller runs in a
  wrapper (``serve`` below) that accumulates ``time.thread_time_ns`` around the synchronous steps
  of ``Enroll`` (CSR parse, signature check, signing, token hashing, store reads, ...) and around
  every resumption of the ``Enroll`` coroutine and the guard's wrapper (inclusive, each on its
  own line: nested lines are part of the line that contains them);
- by shared object and symbol, with ``--perf`` (``perf record`` on the server's PID, user space):
  ``cygrpc`` is gRPC core with BoringSSL (the TLS handshake, HTTP/2), ``_rust.abi3`` is
  ``cryptography`` with its OpenSSL (CSR, signing, the peer certificate's parsing).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
PROFILE_ENV = "TETHER_ENROLL_PROFILE"  # the instrumented server writes its counters here
CPROFILE_ENV = "TETHER_ENROLL_PROFILE_CPROFILE"  # the main thread's cProfile (thread CPU time) goes here
SKIP_ENV = "TETHER_ENROLL_PROFILE_SKIP"  # what-if: a step left out, to see what it costs in all

# -- the instrumented controller (runs in the server process) ------------------------------------

_ns: collections.Counter[str] = collections.Counter()
_calls: collections.Counter[str] = collections.Counter()


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.thread_time_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            key = name if threading.current_thread() is threading.main_thread() else f"{name} [writer]"
            _ns[key] += time.thread_time_ns() - t
            _calls[key] += 1

    return wrapper


class _Steps:
    """Awaits a coroutine, adding the CPU time of each of its resumptions to ``name``."""

    def __init__(self, name: str, coro: Any) -> None:
        self.name, self.coro = name, coro

    def __await__(self) -> Generator[Any, Any, Any]:
        value: Any = None
        error: BaseException | None = None
        _calls[self.name] += 1
        while True:
            t = time.thread_time_ns()
            try:
                step = self.coro.send(value) if error is None else self.coro.throw(error)
            except StopIteration as stop:
                _ns[self.name] += time.thread_time_ns() - t
                return stop.value
            except BaseException:
                _ns[self.name] += time.thread_time_ns() - t
                raise
            _ns[self.name] += time.thread_time_ns() - t
            try:
                value, error = (yield step), None
            except BaseException as exc:  # handed on to the coroutine
                value, error = None, exc


def _timed_async(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        return await _Steps(name, fn(*args, **kwargs))

    return wrapper


def _patch(owner: Any, attr: str, name: str, *, is_async: bool = False) -> None:
    fn = getattr(owner, attr, None)
    if fn is None:  # an older tree (before/after comparisons run this file against both)
        return
    setattr(owner, attr, (_timed_async if is_async else _timed)(name, fn))


def _instrument() -> None:
    from cryptography import x509

    from tether.controller import agent_service, auth, ca, enrollment, guard, metrics, tokens, wire
    from tether.controller.cluster import orchestrator
    from tether.controller.store import sqlite

    _patch(agent_service.AgentService, "Enroll", "Enroll", is_async=True)
    if os.environ.get(SKIP_ENV) == "forget_node":  # what-if only: what the call costs in all

        async def forget_nothing(self: Any, environment: str, node: str) -> None:
            return None

        orchestrator.Orchestrator.forget_node = forget_nothing  # type: ignore[method-assign]
    _patch(orchestrator.Orchestrator, "forget_node", "cluster.forget_node", is_async=True)
    original_unary = guard.Guard._unary_call

    def unary_call(self: Any, method: str, inner: Any, request_streaming: bool) -> Any:
        name = f"guard {method.rsplit('/', 1)[-1]}"
        return _timed_async(name, original_unary(self, method, inner, request_streaming))

    guard.Guard._unary_call = unary_call  # type: ignore[method-assign]
    _patch(auth.Authenticator, "principal", "auth.principal")
    _patch(enrollment, "parse", "enrollment.parse")
    _patch(enrollment, "csr_key_hash", "enrollment.csr_key_hash")
    _patch(enrollment, "read_csr", "enrollment.read_csr")
    _patch(wire, "facts_from_pb", "wire.facts_from_pb")
    _patch(enrollment, "check", "enrollment.check")
    _patch(enrollment, "decide", "enrollment.decide")
    _patch(tokens, "hash_secret", "tokens.hash_secret")
    _patch(ca.CertificateAuthority, "sign_node_csr", "ca.sign_node_csr")
    _patch(ca.CertificateAuthority, "_builder", "ca._builder")
    _patch(ca.CertificateAuthority, "_issue", "ca._issue")
    _patch(x509, "load_pem_x509_csr", "x509.load_pem_x509_csr")
    _patch(metrics, "count_enrollment", "metrics.count_enrollment")
    for attr in ("get_token", "get_node", "get_environment", "max_seq"):
        _patch(sqlite.SqliteStore, attr, f"store.{attr}")
    _patch(sqlite._Writer, "_commit", "store._commit")
    logger = agent_service.log
    with contextlib.suppress(AttributeError, TypeError):
        agent_service.log = _LogTimer(logger)

    profiler = cProfile.Profile(time.thread_time_ns, 1e-9) if os.environ.get(CPROFILE_ENV) else None

    def reset(signum: int, frame: Any) -> None:
        _ns.clear()
        _calls.clear()
        if profiler is not None:
            profiler.enable()

    def dump(signum: int, frame: Any) -> None:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(os.environ[CPROFILE_ENV])
        threads = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
        doc = {"ns": dict(_ns), "calls": dict(_calls), "threads": threads}
        Path(os.environ[PROFILE_ENV]).write_text(json.dumps(doc))

    signal.signal(signal.SIGUSR1, reset)
    signal.signal(signal.SIGUSR2, dump)


class _LogTimer:
    """The Enroll logger, its ``info`` timed."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner  # a lazy proxy: bound on each call (after logging is configured)
        self.info = _timed("log.info", lambda *a, **k: inner.info(*a, **k))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def serve(argv: list[str]) -> None:
    _instrument()
    from tether.controller import main as controller_main

    sys.argv = ["tether-controller", *argv]
    controller_main.main()


# -- the driver ------------------------------------------------------------------------------------


def thread_ns(pid: int) -> dict[int, int]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            out[int(tid)] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    return out


def thread_sys_ticks(pid: int) -> dict[int, int]:
    """Each thread's system time so far (clock ticks: ``/proc/PID/task/TID/stat``, field 15)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            out[int(tid)] = int(stat.rsplit(")", 1)[1].split()[12])
    return out


def perf_start(pid: int, path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["perf", "record", "-F", "1999", "-g", "-p", str(pid), "-o", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def perf_stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)


def perf_split(path: Path, n: int, total_ms: float) -> None:
    """CPU ms per enrollment by shared object, then the top symbols (user space only)."""
    for sort, top in (("dso", 12), ("dso,sym", 40)):
        out = subprocess.run(
            ["perf", "report", "-i", str(path), "--no-children", "--sort", sort, "--stdio", "-g", "none"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        rows = [line for line in out.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        print(f"\n  perf, by {sort} (percent of user-space samples; ms/enrollment of the total CPU):")
        for line in rows[:top]:
            pct = line.split("%", 1)[0].strip()
            with contextlib.suppress(ValueError):
                print(f"    {float(pct) * total_ms / 100:6.3f} ms  {line.strip()[:150]}")


def table(ms: dict[str, float], threads: dict[str, float], total: float) -> None:
    """The enrollment's CPU by part (ms per enrollment), as docs/performance.md shows it: each row
    exclusive of the others, so that they add up to the total."""
    main = threads.get("main (event loop)", 0.0)
    writer = threads.get("store-writer", 0.0)
    grpc = total - main - writer
    g = ms.get
    enroll, guarded = g("Enroll", 0.0), g("guard Enroll", 0.0)
    csr_read = g("enrollment.read_csr", g("enrollment.csr_key_hash", 0.0))
    sign, issue, builder = g("ca.sign_node_csr", 0.0), g("ca._issue", 0.0), g("ca._builder", 0.0)
    reads = g("store.get_token", 0.0) + g("store.get_node", 0.0) / 2 + g("store.max_seq", 0.0)
    check, forget, log_line = g("enrollment.check", 0.0), g("cluster.forget_node", 0.0), g("log.info", 0.0)
    parse_rest = g("enrollment.parse", 0.0) - csr_read
    small = g("auth.principal", 0.0) + g("metrics.count_enrollment", 0.0)
    rows = [
        ("TLS handshake and HTTP/2 (gRPC core threads: event engine, poller)", grpc),
        ("CSR read: PEM parse, public key, SPKI hash (enrollment.parse)", csr_read),
        ("CSR signature verification (and, before, the second parse)", sign - issue - builder),
        ("certificate signing: builder, ECDSA sign, PEM, fingerprint", issue + builder),
        ("token: parse, secret hash, state and scope; environment read (check)", check),
        ("request: name, facts (enrollment.parse less the CSR)", parse_rest),
        ("store reads: token, node, max seq (main thread)", reads),
        ("cluster.forget_node (main thread: reads, 2 kv deletes awaited)", forget),
        ("the 'node enrolled' log line", log_line),
        ("auth.principal, metrics", small),
        (
            "rest of Enroll: node watch, awaits, reply",
            enroll - csr_read - parse_rest - check - reads - sign - forget - log_line - small,
        ),
        ("guard interceptor", guarded - enroll),
        ("gRPC aio in Python, protobuf, event loop (main thread outside the handler)", main - guarded),
        ("store writer thread: enroll_node and 2 kv deletes, ~2.3 commits (fsync)", writer),
    ]
    print("\n  | part | CPU ms per enrollment |\n  |---|---|")
    for label, value in rows:
        print(f"  | {label} | {value:.3f} |")
    hashing = g("tokens.hash_secret", 0.0) + g("tokens.hash_secret [writer]", 0.0)
    print(f"  | **total** (of which token hashing, both checks: {hashing:.3f}) | **{total:.3f}** |")


def callgrind_split(work: Path, name: str, pid: int, n: int) -> None:
    """Instructions per enrollment (user space, repeatable whatever the machine's load), by thread:
    the files of the dump taken after the measured enrollments (``--separate-threads=yes``)."""
    from bench.callgrind import totals

    files = sorted(work.glob(f"cg-{name}.{pid}.*"))
    by_thread: dict[str, int] = {}
    for path in files:
        tid = path.name.rsplit("-", 1)[-1]
        by_thread[tid] = by_thread.get(tid, 0) + totals(path.read_text(errors="replace"))
    total = sum(by_thread.values())
    print(f"  callgrind: {total / n / 1e6:.3f} M instructions per enrollment (user space); by thread:")
    for tid, ir in sorted(by_thread.items(), key=lambda kv: -kv[1])[:8]:
        print(f"    {ir / n / 1e6:7.3f} M  thread {tid}{' (main)' if tid == '01' else ''}")


def measure(server: Any, sims: Any, args: argparse.Namespace, token: str, instrumented: bool) -> None:
    from bench.scenarios import ENROLL_CONCURRENCY, names

    bare = token == ""

    def enroll(prefix: str, count: int) -> dict[str, Any]:
        sims.call({"cmd": "prepare_enroll", "names": names(prefix, count)})
        (reply,) = sims.call(
            {
                "cmd": "enroll",
                "bare": bare,
                "target": server.address,
                "ca": str(server.ca_file),
                "token": token,
                "concurrency": ENROLL_CONCURRENCY,
            },
            timeout=1800,
        )
        if reply["errors"]:
            raise RuntimeError(f"enrollment errors: {reply['errors']} ({reply['first_error']})")
        return dict(reply)

    pid = server.p.pid
    enroll("warm", args.warmup)
    if instrumented:
        os.kill(pid, signal.SIGUSR1)
    if args.callgrind:
        subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-i", "on", str(pid)], check=True, capture_output=True)
    time.sleep(0.5)
    perf_path = Path(args.work) / f"perf-{server.name}.data"
    perf = perf_start(pid, perf_path) if args.perf else None
    if perf is not None:
        time.sleep(1.0)
    t0, c0, k0 = thread_ns(pid), server.p.cpu_seconds(), thread_sys_ticks(pid)
    reply = enroll("prof", args.count)
    t1, c1, k1 = thread_ns(pid), server.p.cpu_seconds(), thread_sys_ticks(pid)
    if perf is not None:
        perf_stop(perf)
    if args.callgrind:
        subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-i", "off", str(pid)], check=True, capture_output=True)
    n = reply["ok"]
    span = reply["t1"] - reply["t0"]
    threads: dict[int, str] = {}
    counters: dict[str, Any] = {}
    if instrumented:
        out = Path(os.environ[PROFILE_ENV])
        out.unlink(missing_ok=True)
        os.kill(pid, signal.SIGUSR2)
        for _ in range(100):
            if out.exists() and out.stat().st_size:
                break
            time.sleep(0.1)
        counters = json.loads(out.read_text())
        threads = {int(k): v for k, v in counters["threads"].items()}
    total_ms = sum(t1[t] - t0.get(t, 0) for t in t1) / 1e6 / n
    print(f"\n== {server.name}: {n} enrollments in {span:.1f}s ({n / span:.0f}/s wall, shared machine)")
    print(
        f"  CPU per enrollment: {total_ms:.3f} ms (schedstat, all threads); {1000 * (c1 - c0) / n:.3f} ms"
        " (utime+stime ticks)"
    )
    by_thread: collections.Counter[str] = collections.Counter()
    sys_ms: dict[str, float] = collections.defaultdict(float)
    for tid, ns in t1.items():
        label = "main (event loop)" if tid == pid else threads.get(tid, "other (gRPC core / native)")
        by_thread[label] += ns - t0.get(tid, 0)
        sys_ms[label] += 1000 * (k1.get(tid, 0) - k0.get(tid, 0)) / CLK_TCK
    print("  by thread (of which in the kernel: stime, 10 ms ticks):")
    for label, ns in by_thread.most_common():
        print(f"    {ns / 1e6 / n:6.3f} ms  ({sys_ms[label] / n:5.3f} ms kernel)  {label}")
    if counters:
        print("  by function (thread CPU, inclusive, ms per enrollment; calls per enrollment):")
        for name, ns in sorted(counters["ns"].items(), key=lambda kv: -kv[1]):
            print(f"    {ns / 1e6 / n:6.3f} ms  {counters['calls'][name] / n:5.2f}x  {name}")
        ms = {name: ns / 1e6 / n for name, ns in counters["ns"].items()}
        table(ms, {label: ns / 1e6 / n for label, ns in by_thread.items()}, total_ms)
    if perf is not None:
        perf_split(perf_path, n, total_ms)
    if args.callgrind:
        callgrind_split(Path(args.work), server.name, pid, n)
    prof = os.environ.get(CPROFILE_ENV)
    if instrumented and prof:
        import pstats

        stats = pstats.Stats(prof)
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(30)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--server", choices=("controller", "bare", "both"), default="both")
    p.add_argument("--perf", action="store_true")
    p.add_argument("--no-instrument", action="store_true")
    p.add_argument("--work", default="")
    p.add_argument(
        "--callgrind",
        action="store_true",
        help="the server under valgrind --tool=callgrind: instructions, not seconds (about 50 times slower)",
    )
    p.add_argument("--cprofile", action="store_true", help="cProfile the main thread (inflates Python)")
    p.add_argument(
        "--skip-forget-node",
        action="store_true",
        help="what-if, not a valid controller: Enroll's cluster.forget_node left out, to see its whole cost",
    )
    args = p.parse_args()
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        raise SystemExit("use: python -m bench.enroll_profile serve ...")

    from bench import messages
    from bench.common import BIN, SERVER_CPUS, Proc
    from bench.servers import Bare, Controller, Sims

    def wrapped(name: str, argv: list[str], instrumented: bool) -> list[str]:
        if instrumented:
            argv = [str(BIN / "python"), "-m", "bench.enroll_profile", "serve", *argv[1:]]
        if args.callgrind:
            out = f"--callgrind-out-file={args.work}/cg-{name}.%p"
            argv = [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                "--separate-threads=yes",
                out,
                *argv,
            ]
        return argv

    def start(server: Any) -> None:
        """``Server.start``, with the time a server under callgrind needs to come up."""
        server.started_at = time.monotonic()
        server.proc = Proc(
            server.command(server.port), cpus=SERVER_CPUS, log_path=Path(args.work) / f"{server.name}.log"
        )
        m = server.proc.wait_for_line(r"listening on (\S+):(\d+)", timeout=900)
        server.port = int(m.group(2))
        server.address = f"127.0.0.1:{server.port}"

    class ProfiledController(Controller):
        def command(self, port: int) -> list[str]:
            return wrapped(self.name, super().command(port), not args.no_instrument)

        def start(self, port: int | None = None) -> None:
            start(self)

    class ProfiledBare(Bare):
        def command(self, port: int) -> list[str]:
            return wrapped(self.name, super().command(port), False)

        def start(self, port: int | None = None) -> None:
            start(self)

    with contextlib.ExitStack() as stack:
        work = Path(args.work or stack.enter_context(tempfile.TemporaryDirectory(prefix="enroll-prof-")))
        work.mkdir(parents=True, exist_ok=True)
        args.work = str(work)
        os.environ[PROFILE_ENV] = str(work / "counters.json")
        if args.cprofile:
            os.environ[CPROFILE_ENV] = str(work / "main-thread.prof")
        if args.skip_forget_node:
            os.environ[SKIP_ENV] = "forget_node"
        stack.callback(Proc.cleanup)
        if args.server in ("bare", "both"):
            bare = ProfiledBare(work, 10)
            bare.start()
            sims = Sims(work, "bare", 1)
            try:
                measure(bare, sims, args, "", False)
            finally:
                sims.close()
                bare.stop()
        if args.server in ("controller", "both"):
            ctl = ProfiledController(work, 10)
            ctl.start()
            ctl.apply(messages.environment_yaml(messages.BENCH_ENV, messages.BENCH_STEPS))
            token = ctl.token(messages.BENCH_ENV, uses=args.count + args.warmup + 10)
            sims = Sims(work, "ctl", 1)
            try:
                measure(ctl, sims, args, token, not args.no_instrument)
            finally:
                sims.close()
                ctl.stop()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(sys.argv[2:])
    else:
        main()
