"""Instructions per operation of the agent's step path: the profile behind docs/performance.md.

    python bench/agent_ops.py --work DIR SCRIPT [--repeat N]

Run under callgrind, it splits the counts by operation (one dump per operation, N repetitions
each): a log line, a journal transition (the step's record and its event, one commit), the
writer's part (the next batch read, encoded, fsync'd, acknowledged), a run of the step
``SCRIPT`` by the runner, and the same script spawned by bare asyncio (the floor under any
asyncio agent). Without valgrind it runs the same operations once, as a check.

    valgrind --tool=callgrind --dump-before=getppid --callgrind-out-file=DIR/cg.%p \\
        python bench/agent_ops.py --work DIR/w SCRIPT > DIR/ops.json
    python bench/agent_ops.py --report DIR          # instructions per operation
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "proto"))  # the tether package

from bench import callgrind
from bench.agent_steps import PlanBench, child_watcher, mark
from tether.nodeagent import facts, logs, wire
from tether.nodeagent.journal import JournalState
from tether.nodeagent.model import Event, EventKind, now_ms


async def operations(work: Path, script: str, repeat: int) -> list[str]:
    bench = PlanBench(work / "state", [script] * 3, facts.boot_id())
    ex, plan, outbox = bench.executor, bench.plan, bench.executor.outbox
    step = plan.steps[0]
    log = logs.get_logger("tether.agent.executor")
    bench.start()
    await bench.run_pass()
    await bench.run_pass()
    await bench.stop()  # from here on, nothing runs but what is measured
    bench = PlanBench(work / "state", [script] * 3, facts.boot_id())
    ex, plan, outbox = bench.executor, bench.plan, bench.executor.outbox
    env = {**bench.runner.base_env, "TETHER_WORKDIR": str(work)}

    async def floor() -> None:
        proc = await asyncio.create_subprocess_exec(
            "bash",
            str(bench.runner.script_path(step)),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            env=env,
            cwd=str(work),
        )
        assert proc.stdout is not None
        await proc.stdout.read()
        await proc.wait()

    async def sink(lines: list[str]) -> None:
        pass

    async def log_line() -> None:
        with logs.bound(plan_generation=plan.generation, step=step.name):
            log.info("step started", attempt=1)

    async def transition() -> None:
        ex._transition(plan, step, JournalState.RUNNING, EventKind.STARTED, attempt=1, durable=False)

    sent = [outbox.acked_seq]

    async def writer() -> None:  # what Session._writer and the ack do with the events made
        events = outbox.pending(after_seq=sent[0])
        await bench.db.sync()
        wire.pb.AgentMessage(events=wire.events_to_pb(events)).SerializeToString()
        sent[0] = events[-1].seq
        outbox.ack(sent[0])
        outbox.pending(after_seq=sent[0])  # nothing more: the writer waits

    async def started_sent() -> None:
        await transition()
        await writer()

    async def succeeded() -> None:
        ex._transition(
            plan,
            step,
            JournalState.SUCCEEDED,
            EventKind.SUCCEEDED,
            attempt=1,
            durable=False,
            before=[
                Event(
                    kind=EventKind.OUTPUT,
                    step=step.name,
                    digest=step.digest,
                    lines=("step 1",),
                    time_ms=now_ms(),  # as the executor makes it
                )
            ],
            observed={"custom.s00.phase": "pre-install"},
            duration_seconds=0.004,
        )

    async def journal_get() -> None:
        ex.journal.get(step.digest)

    async def runner_run() -> None:
        await bench.runner.run(step, sink, extra_env={}, final_output=sink)

    async def succeeded_sent() -> None:
        await succeeded()
        await writer()

    async def nothing() -> None:
        pass

    # (name, the operation, what tidies up after its repetitions: counted apart, not reported)
    ops: list[tuple[str, Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]] = [
        ("log line", log_line, nothing),
        ("transition (started)", transition, writer),
        ("transition (output + succeeded)", succeeded, writer),
        ("transition (started) + writer", started_sent, nothing),
        ("transition (output + succeeded) + writer", succeeded_sent, nothing),
        ("journal.get", journal_get, nothing),
        ("runner.run", runner_run, nothing),
        ("asyncio floor", floor, nothing),
    ]
    for _, op, tidy in ops:  # every path once before counting
        await op()
        await tidy()
    phases = ["start"]
    mark()
    for name, op, tidy in ops:
        for _ in range(repeat):
            await op()
        phases.append(name)
        mark()
        await tidy()
        phases.append("-")
        mark()
    bench.db.close()
    return phases


def report(directory: Path, repeat: int) -> dict[str, float]:
    doc = json.loads((directory / "ops.json").read_text())
    (counts,) = callgrind.dumps(directory).values()
    return {
        name: ir / repeat
        for name, ir in zip(doc["phases"], counts, strict=False)
        if name not in ("start", "-")
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path)
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--report", type=Path, help="print instructions per operation from this directory")
    p.add_argument("script", nargs="?", type=Path)
    args = p.parse_args()
    if args.report:
        for name, ir in report(args.report, args.repeat).items():
            print(f"{ir / 1000:9.1f} k  {name}")
        return 0
    if args.work is None or args.script is None:
        p.error("--work and SCRIPT are needed")
    args.work.mkdir(parents=True, exist_ok=True)
    with (args.work / "agent.log").open("a") as log_file:
        logs.configure("info", stream=log_file)
        child_watcher()
        phases = asyncio.run(operations(args.work, args.script.read_text(), args.repeat))
    print(json.dumps({"phases": phases}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
