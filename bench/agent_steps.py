"""The agent's own work per step: its executor, journal, outbox and runner walk a plan of real step
scripts, as in ``tether-agent``, with a stand-in for the session's writer (fsync the WAL, encode
the batch as the protobuf the stream carries, acknowledge it at once). No gRPC and no controller:
what is left is what the agent does around each bash process.

    python bench/agent_steps.py prepare --work DIR --small N SCRIPT...
    python bench/agent_steps.py count --work DIR --small N [--pairs R] [--calibration K] SCRIPT...
    python bench/agent_steps.py time  --work DIR [--pairs R] [--calibration K --calibration-reps R] SCRIPT...

``count`` runs under ``valgrind --tool=callgrind --dump-before=getppid``: the process calls
``os.getppid()`` (nothing else in it does) at the end of each phase, so callgrind writes one dump
per phase: two plans (the first N scripts, then all of them), run once to warm up, then rerun
alternately R times, then K rounds of the calibration loop. Phases are listed on stdout (JSON),
in dump order. ``prepare`` (natively, first) leaves the state a rerun finds: scripts written,
journal filled.

``time`` alternates one agent pass over all the scripts with one bash pass over the same scripts
(``bash -c 'for f; do bash "$f"; done'``, the same work directory variables set), R times, and
times the calibration loop; it prints wall, user and system seconds of every pass (JSON).

The work directory gets one state directory per plan and the agent's log lines (JSON, as on the
agent's stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "proto"))  # the tether package

from tether.nodeagent import facts, logs, wire
from tether.nodeagent.executor import Executor, scripts_dir
from tether.nodeagent.model import Event, EventKind, Plan, Step
from tether.nodeagent.outbox import Outbox
from tether.nodeagent.runner import Runner
from tether.nodeagent.secrets import PROCESS_REDACTOR
from tether.nodeagent.statedb import DB_NAME, StateDB

BASH_LOOP = 'for f in "$@"; do bash "$f"; done'


def mark() -> None:
    """The end of a phase: callgrind (``--dump-before=getppid``) writes its counts so far."""
    os.getppid()


class PlanBench:
    """One state directory, one executor walking one plan; every event is sent and acknowledged."""

    def __init__(self, state: Path, scripts: list[str], boot_id: str) -> None:
        self.db = StateDB(state / DB_NAME)
        self.runner = Runner(scripts_dir(state), PROCESS_REDACTOR, cwd=state / "workspace")
        self.kick = asyncio.Event()
        self.done = asyncio.Event()

        async def no_reboot() -> None:
            raise RuntimeError("no reboot in this benchmark")

        async def no_gate(step: Step, attempt: int) -> dict[str, str]:
            raise RuntimeError("no gate in this benchmark")

        self.executor = Executor(
            self.db,
            self.runner,
            boot_id=lambda: boot_id,
            reboot=no_reboot,
            gate=no_gate,
            on_events=self.kick.set,
        )
        self.plan = Plan.build(
            [Step(name=f"custom-s{i:02d}", script=s) for i, s in enumerate(scripts)],
            generation=1,
            environment="overhead",
            role="worker",
        )
        self.last_step = self.plan.steps[-1].name
        self.events = 0
        self.batches = 0
        self.failed = ""
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self.executor.run_forever()),
            asyncio.create_task(self._writer()),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.db.close()

    async def _writer(self) -> None:
        """What ``Session._writer`` does with the outbox, with the controller's ack at once."""
        outbox: Outbox = self.executor.outbox
        last_sent = outbox.acked_seq
        while True:
            self.kick.clear()
            events = outbox.pending(after_seq=last_sent)
            if events:
                await self.db.sync()
                wire.pb.AgentMessage(events=wire.events_to_pb(events)).SerializeToString()
                last_sent = events[-1].seq
                outbox.ack(last_sent)
                self.events += len(events)
                self.batches += 1
                failed = [e for e in events if e.kind is EventKind.FAILED]
                if failed:
                    self.failed = f"{failed[0].step}: {failed[0].message}"
                    self.done.set()
                elif _finishes(events[-1], self.last_step):
                    self.done.set()
                continue
            await self.kick.wait()

    async def run_pass(self) -> None:
        """The whole plan once more (the first time: as received; then as after RerunSteps)."""
        self.done.clear()
        if self.executor.plan is None or self.executor.plan.digest != self.plan.digest:
            self.executor.set_plan(self.plan)
        else:
            self.executor.rerun([])
        await self.done.wait()
        if self.failed:
            raise RuntimeError(f"the plan failed at {self.failed} (see the agent log)")


def _finishes(event: Event, last_step: str) -> bool:
    return event.step == last_step and event.kind is EventKind.SUCCEEDED


# -- the calibration loop -------------------------------------------------------------------------


def calibration(rounds: int) -> int:
    """Pure user-space work of the agent's kind, no system call: build events, JSON and protobuf
    round trips, a dataclass replace, a regex scan, in-memory SQLite inserts and deletes.

    Its instructions (callgrind) over its CPU seconds (timed natively) give this CPU's rate for
    this Python on this kind of code, which turns the agent's instructions into seconds."""
    import sqlite3

    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE t (seq INTEGER PRIMARY KEY, body TEXT NOT NULL)")
    total = 0
    for i in range(rounds):
        e = Event(
            kind=EventKind.OUTPUT,
            step=f"custom-s{i % 50:02d}",
            digest="0123456789abcdef" * 4,
            attempt=1,
            lines=(f"step {i}", "[12:00:00] checking the operating system"),
            plan_generation=3,
        )
        e = replace(e, seq=i + 1, time_ms=1_700_000_000_000 + i)
        body = json.dumps(e.to_json(), separators=(",", ":"))
        back = Event.from_json(json.loads(body))
        total += len(wire.events_to_pb([back]).SerializeToString())
        total += len(PROCESS_REDACTOR.redact(body))
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (?,?)", (i, body))
        conn.execute("DELETE FROM t WHERE seq<?", (i,))
        conn.execute("COMMIT")
    conn.close()
    return total


def time_calibration(rounds: int, reps: int) -> list[float]:
    """CPU seconds (this thread) of ``calibration(rounds)``, ``reps`` times."""
    calibration(rounds)  # warm
    out = []
    for _ in range(reps):
        t0 = time.thread_time()
        calibration(rounds)
        out.append(time.thread_time() - t0)
    return out


# -- the two modes ----------------------------------------------------------------------------------


def child_watcher() -> str:
    """The pidfd child watcher, as ``tether.nodeagent.main`` sets it on Python 3.11 (3.12 picks it
    itself). Valgrind 3.19 does not know ``pidfd_open``: under it, the SIGCHLD watcher is the
    nearest stand-in (no thread per step either; the agent's fallback would start one)."""
    if sys.version_info >= (3, 12):
        return "default"
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (OSError, AttributeError):
        asyncio.get_event_loop_policy().set_child_watcher(asyncio.SafeChildWatcher())
        return "sigchld"
    asyncio.get_event_loop_policy().set_child_watcher(asyncio.PidfdChildWatcher())
    return "pidfd"


def _rusage() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


async def prepare(args: argparse.Namespace, scripts: list[str]) -> dict[str, Any]:
    """Scripts written and the journal filled, for ``count`` (whose warm-up then costs less)."""
    boot_id = facts.boot_id()
    for bench in (
        PlanBench(args.work / "small", scripts[: args.small], boot_id),
        PlanBench(args.work / "large", scripts, boot_id),
    ):
        bench.start()
        await bench.run_pass()
        await bench.stop()
    return {}


async def count(args: argparse.Namespace, scripts: list[str]) -> dict[str, Any]:
    boot_id = facts.boot_id()
    small = PlanBench(args.work / "small", scripts[: args.small], boot_id)
    large = PlanBench(args.work / "large", scripts, boot_id)
    for bench in (small, large):
        bench.start()
        await bench.run_pass()  # every code path once: first-time costs are not per step
    phases = ["start"]
    mark()
    for _ in range(args.pairs):
        for bench, label in ((small, "small"), (large, "large")):
            before = bench.events
            await bench.run_pass()
            phases.append(f"{label}:{bench.events - before}")
            mark()
    if args.calibration:
        calibration(args.calibration)
        phases.append("calibration")
        mark()
    for bench in (small, large):
        await bench.stop()
    return {"phases": phases, "small": args.small, "large": len(scripts), "calibration": args.calibration}


async def timed(args: argparse.Namespace, scripts: list[str]) -> dict[str, Any]:
    bench = PlanBench(args.work / "large", scripts, facts.boot_id())
    bench.start()
    await bench.run_pass()
    await bench.run_pass()
    paths = [str(bench.runner.script_path(step)) for step in bench.plan.steps]
    bash_work = args.work / "bash-work"
    bash_work.mkdir(exist_ok=True)
    env = {**bench.runner.base_env, "TETHER_WORKDIR": str(bash_work), "TETHER_STEP": "bash"}
    agent: list[dict[str, float]] = []
    bash: list[dict[str, float]] = []
    for _ in range(args.pairs):
        u0, s0 = _rusage()
        t0 = time.perf_counter()
        await bench.run_pass()
        t1 = time.perf_counter()
        u1, s1 = _rusage()
        agent.append({"wall_s": t1 - t0, "user_s": u1 - u0, "sys_s": s1 - s0})
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(
            ["bash", "-c", BASH_LOOP, "bash", *paths],
            check=True,
            stdout=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            cwd=str(bash_work),
            env=env,
        )
        t1 = time.perf_counter()
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        bash.append(
            {"wall_s": t1 - t0, "user_s": c1.ru_utime - c0.ru_utime, "sys_s": c1.ru_stime - c0.ru_stime}
        )
    await bench.stop()
    out: dict[str, Any] = {"steps": len(scripts), "agent": agent, "bash": bash}
    if args.calibration:
        runs = time_calibration(args.calibration, args.calibration_reps)
        out["calibration"] = {"rounds": args.calibration, "cpu_s": runs, "median_s": statistics.median(runs)}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["prepare", "count", "time"])
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--small", type=int, default=10, help="count: steps of the smaller plan")
    p.add_argument("--pairs", type=int, default=1)
    p.add_argument("--calibration", type=int, default=0, help="rounds of the calibration loop")
    p.add_argument("--calibration-reps", type=int, default=30)
    p.add_argument("scripts", nargs="+", type=Path)
    args = p.parse_args()
    scripts = [path.read_text() for path in args.scripts]
    args.work.mkdir(parents=True, exist_ok=True)
    with (args.work / "agent.log").open("a") as log_file:
        logs.configure("info", stream=log_file)
        watcher = child_watcher()
        run = {"prepare": prepare, "count": count, "time": timed}[args.mode]
        doc = asyncio.run(run(args, scripts))
        doc["child_watcher"] = watcher
    print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
