"""The agent's figures: what it costs per step over bash running the same steps, and what it costs
a node while idle. See docs/performance.md (agent overhead, agent footprint).

Overhead, in one run:

- instructions (stable whatever the machine's load): the agent's own work for one step
  (executor, journal, outbox, runner, the session writer's part; not the bash it runs), counted
  by callgrind in ``bench/agent_steps.py`` as (a 50-step plan - a 10-step plan) / 40, against
  bash's instructions for the same step scripts, counted the same way; and turned into time at
  this CPU's rate for Python (a calibration loop, counted by callgrind and timed natively in one
  process): a lower bound, as callgrind does not see the kernel.
- CPU and wall clock: ``bench/agent_steps.py time`` alternates an agent pass over the plan with a
  bash pass over the same scripts; medians with bootstrap intervals.
- the real ``tether-agent`` (with its gRPC session) runs the plan, alternating with bash passes.

Footprint: two enrolled agents, each with its own controller (heartbeat 1 s, and the default
30 s), idle after running the plan; VmRSS, and CPU over the window from /proc.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from bench import callgrind, messages
from bench.common import BIN, CLIENT_CPUS, CLK_TCK, Figure, Proc, child_env, log, pinned
from bench.servers import Controller
from bench.stats import bootstrap_ci, per_step, spread

if TYPE_CHECKING:
    from bench.scenarios import Sizes

OVERHEAD_STEPS = 50
SMALL_STEPS = 10  # the smaller plan of the instruction count: (50-step - 10-step) / 40
BASH_SMALL, BASH_LARGE = 2, 8  # bash's count: every step script costs bash about the same
CALIBRATION_ROUNDS = 200  # ~70 M instructions: 2 s under callgrind, 10-20 ms natively
CALIBRATION_REPS = 40
SHORT_HEARTBEAT, DEFAULT_HEARTBEAT = 1, 30
TARGET_MS, TARGET_PCT = 1.0, 2.0
TARGET_RSS_MIB, TARGET_IDLE_CPU_PCT = 40.0, 0.1
HARNESS = Path(__file__).with_name("agent_steps.py")
BASH_LOOP = 'for f in "$@"; do bash "$f"; done'
ALL_CPUS = set(os.sched_getaffinity(0))

NAMES = (
    ("agent.overhead_ms_per_step", "ms/step"),
    ("agent.overhead_pct", "%"),
    ("agent.instructions_per_step", "instructions/step"),
    ("agent.cpu_ms_per_step", "ms/step"),
    ("agent.wall_overhead_ms_per_step", "ms/step"),
    ("agent.rss_mib", "MiB"),
    ("agent.idle_cpu_pct", "% of a core"),
    ("agent.idle_cpu_pct_heartbeat_1s", "% of a core"),
)
# What structlog imports when it is installed, only to pretty-print on a terminal (rich brings
# pygments and attrs along): this venv has rich (tetherctl's), the agent's bundle does not carry
# it (tether.bootstrap.bundle.REQUIREMENTS). Real agents here run without them, as on a node.
NOT_IN_THE_BUNDLE = ("rich", "better_exceptions", "colorama")


def overhead_steps() -> tuple[tuple[str, str], ...]:
    return tuple((f"s{i:02d}", f'echo "step {i}"\n') for i in range(OVERHEAD_STEPS))


# -- a real agent -----------------------------------------------------------------------------------


@dataclass
class RealAgent:
    """What the real ``tether-agent`` did: plan spans, interleaved with bash passes."""

    spans: list[float] = field(default_factory=list)  # seconds, on the agent's clock
    cpu: list[float] = field(default_factory=list)  # the agent's CPU seconds over each rerun
    bash: list[float] = field(default_factory=list)  # seconds, the bash pass after each span
    first_done_s: float = 0.0
    first_memory: dict[str, float] = field(default_factory=dict)
    restarted_memory: dict[str, float] = field(default_factory=dict)
    scripts: list[Path] = field(default_factory=list)


def as_deployed(work: Path) -> dict[str, str]:
    """The agents' environment: ``NOT_IN_THE_BUNDLE`` cannot be imported (a stub that says so)."""
    hide = work / "not-in-the-bundle"
    for name in NOT_IN_THE_BUNDLE:
        (hide / name).mkdir(parents=True, exist_ok=True)
        (hide / name / "__init__.py").write_text(f"raise ImportError('{name}: not in the agent bundle')\n")
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(hide), env["PYTHONPATH"]])
    return env


def start_agent(work: Path, ctl: Controller, state: Path, node: str, *extra: str) -> Proc:
    return Proc(
        [
            str(BIN / "tether-agent"),
            "run",
            "--controller",
            ctl.address,
            "--state-dir",
            str(state),
            "--node-name",
            node,
            *extra,
            "--reboot-command",
            "true",
        ],
        cpus=CLIENT_CPUS,
        log_path=work / f"agent-{node}.log",
        stdout=False,
        env=as_deployed(work),
    )


def memory(proc: Proc) -> dict[str, float]:
    return {
        "rss_mib": proc.rss_mib(),
        "peak_rss_mib": proc.status_kib("VmHWM") / 1024,
        "anon_mib": proc.status_kib("RssAnon") / 1024,
        "file_backed_mib": proc.status_kib("RssFile") / 1024,
        "threads": proc.status_kib("Threads"),
    }


def bash_env(work: Path) -> dict[str, str]:
    """Bash gets what the agent gives a step: a work directory (without it, the step script
    makes and removes one itself: two more processes per step that the agent does not run)."""
    work.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TERM", "USER")}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    env.update(DEBIAN_FRONTEND="noninteractive", TETHER_WORKDIR=str(work), TETHER_STEP="bash")
    return env


def bash_pass(work: Path, scripts: list[Path]) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        pinned(["bash", "-c", BASH_LOOP, "bash", *map(str, scripts)], CLIENT_CPUS),
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        cwd=str(work),
        env=bash_env(work),
    )
    return time.perf_counter() - t0


def real_agent(
    work: Path, ctl: Controller, sizes: Sizes, env: str, steps: tuple[tuple[str, str], ...]
) -> RealAgent:
    """A real agent enrolls and runs the plan ``overhead_runs`` times (``RerunSteps``), each run
    followed by a bash pass over the same scripts; then it is restarted and runs it once more."""
    from tether.v1 import admin_pb2

    out = RealAgent()
    token = ctl.token(env, uses=1)
    state = work / "agent-state"
    node = "overhead-node"
    bash_work = work / "bash-work"
    t_start = time.monotonic()
    # The first process enrolls (and execs itself again, leaving the crypto library behind),
    # then runs the plan; the second is the agent as a node runs it after a restart or reboot.
    agent = start_agent(work, ctl, state, node, "--token", token, "--ca-hash", ctl.ca_hash())
    after = 0
    scripts: list[Path] = []
    try:
        for run in range(sizes.overhead_runs):
            cpu0 = agent.cpu_seconds()
            if run:
                ctl.admin().RerunSteps(admin_pb2.RerunStepsRequest(node=node), timeout=30)
            span, after = wait_plan_run(ctl, node, after, steps)
            if run:  # (the first run enrolls and starts the agent too)
                out.cpu.append(agent.cpu_seconds() - cpu0)
            if not run:
                out.first_done_s = time.monotonic() - t_start
                scripts = scripts_in_order(ctl, node, state)
            out.spans.append(span)
            out.bash.append(bash_pass(bash_work, scripts))
        time.sleep(1)
        out.first_memory = memory(agent)
    finally:
        agent.stop()
    agent = start_agent(work, ctl, state, node)
    try:
        rerun_when_connected(ctl, node)
        span, after = wait_plan_run(ctl, node, after, steps)
        out.spans.append(span)
        out.bash.append(bash_pass(bash_work, scripts))
        time.sleep(1)
        out.restarted_memory = memory(agent)
    finally:
        agent.stop()
    out.scripts = scripts
    return out


def rerun_when_connected(ctl: Controller, node: str, timeout: float = 60) -> None:
    from tether.v1 import admin_pb2

    deadline = time.monotonic() + timeout
    while True:  # until the restarted agent is connected again
        try:
            ctl.admin().RerunSteps(admin_pb2.RerunStepsRequest(node=node), timeout=30)
            return
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def wait_plan_run(
    ctl: Controller, node: str, after: int, steps: tuple[tuple[str, str], ...], timeout: float = 120
) -> tuple[float, int]:
    """Wait for one full run of the plan (events after ``after``); its span on the agent's clock."""
    first_step, last_step = f"custom-{steps[0][0]}", f"custom-{steps[-1][0]}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with ctl.db() as db:
            rows = db.execute(
                "SELECT seq, time_ms, kind, step FROM events WHERE node=? AND seq>? ORDER BY seq",
                (node, after),
            ).fetchall()
        started = [r for r in rows if r[3] == first_step and r[2] == 1]  # EventKind.STARTED
        done = [r for r in rows if r[3] == last_step and r[2] in (3, 4)]  # SUCCEEDED, FAILED
        if started and done and done[-1][0] > started[0][0]:
            failed = [r for r in rows if r[2] == 4]
            if failed:
                raise RuntimeError(f"agent overhead plan failed: {failed[:3]}")
            return (done[-1][1] - started[0][1]) / 1000, done[-1][0]
        time.sleep(0.1)
    raise TimeoutError(f"the agent {node} did not finish its plan (see {ctl.work}/agent-{node}.log)")


def scripts_in_order(ctl: Controller, node: str, state: Path) -> list[Path]:
    with ctl.db() as db:
        rows = db.execute(
            "SELECT digest FROM node_steps WHERE node=? AND name LIKE 'custom-%' ORDER BY ordinal", (node,)
        ).fetchall()
    paths = [state / "scripts" / f"{digest}.sh" for (digest,) in rows]
    missing = [p for p in paths if not p.exists()]
    if missing or len(paths) != OVERHEAD_STEPS:
        raise RuntimeError(f"agent scripts not found: {missing[:3]} ({len(paths)} steps)")
    return paths


def bare_python_rss() -> float:
    out = subprocess.run(
        [
            str(BIN / "python"),
            "-c",
            "import grpc, re\n"
            "print(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read()).group(1))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip()) / 1024


# -- the agent's step path, alone (bench/agent_steps.py) -------------------------------------------


def harness_time(work: Path, scripts: list[Path], pairs: int) -> dict[str, Any]:
    """Interleaved agent and bash passes, and the calibration loop timed (one process)."""
    out = subprocess.run(
        pinned(
            [
                sys.executable,
                str(HARNESS),
                "time",
                "--work",
                str(work),
                "--pairs",
                str(pairs),
                "--calibration",
                str(CALIBRATION_ROUNDS),
                "--calibration-reps",
                str(CALIBRATION_REPS),
                *map(str, scripts),
            ],
            CLIENT_CPUS,
        ),
        check=True,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=as_deployed(work),
    )
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


def harness_prepare(work: Path, scripts: list[Path]) -> None:
    """The state a rerun finds (scripts written, journal filled), made natively: it is not counted."""
    subprocess.run(
        [
            sys.executable,
            str(HARNESS),
            "prepare",
            "--work",
            str(work),
            "--small",
            str(SMALL_STEPS),
            *map(str, scripts),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env=as_deployed(work),
    )


class Counting:
    """The callgrind runs, in the background: the agent's step path, and bash on the same scripts."""

    def __init__(self, work: Path, scripts: list[Path], pairs: int) -> None:
        self.work = work
        self.agent_dir = work / "callgrind-agent"
        self.agent_dir.mkdir(parents=True, exist_ok=True)
        harness_prepare(work / "harness-count", scripts)
        self.agent = Proc(
            callgrind.command(
                self.agent_dir,
                [
                    sys.executable,
                    str(HARNESS),
                    "count",
                    "--work",
                    str(work / "harness-count"),
                    "--small",
                    str(SMALL_STEPS),
                    "--pairs",
                    str(pairs),
                    "--calibration",
                    str(CALIBRATION_ROUNDS),
                    *map(str, scripts),
                ],
                marker="getppid",
            ),
            cpus=ALL_CPUS,
            log_path=work / "callgrind-agent.log",
            env=as_deployed(work),
        )
        self.bash: dict[int, Proc] = {}
        bash_work = work / "bash-count-work"
        for n in (BASH_SMALL, BASH_LARGE):
            d = work / f"callgrind-bash-{n}"
            d.mkdir(parents=True, exist_ok=True)
            self.bash[n] = Proc(
                callgrind.command(
                    d,
                    ["bash", "-c", BASH_LOOP, "bash", *map(str, scripts[:n])],
                    children=True,
                    marker=callgrind.FORKS,
                ),
                cpus=ALL_CPUS,
                log_path=work / f"callgrind-bash-{n}.log",
                cwd=bash_work,
                env=bash_env(bash_work),
            )

    def result(self, timeout: float = 600) -> dict[str, Any]:
        line = self.agent.readline(timeout)  # the phases, once the harness is done
        doc: dict[str, Any] = json.loads(line)
        self.agent.popen.wait(timeout=60)
        for p in self.bash.values():
            if p.popen.wait(timeout=timeout) != 0:
                raise RuntimeError(f"bash under callgrind failed: {p.tail()}")
        counts = callgrind.dumps(self.agent_dir)
        if len(counts) != 1:
            raise RuntimeError(f"expected one counted process, found {sorted(counts)}")
        (dumped,) = counts.values()
        phases: list[str] = doc["phases"]
        agent, calibration = phase_counts(phases, dumped, doc["small"], doc["large"])
        bash_total = {
            n: sum(sum(c) for c in callgrind.dumps(self.work / f"callgrind-bash-{n}").values())
            for n in self.bash
        }
        bash = per_step(bash_total[BASH_SMALL], bash_total[BASH_LARGE], BASH_SMALL, BASH_LARGE)
        if bash <= 0:
            raise RuntimeError(f"bash: {bash_total} instructions for {BASH_SMALL} and {BASH_LARGE} steps")
        return {
            "agent_per_step": agent,
            "bash_per_step": bash,
            "calibration_per_round": calibration / doc["calibration"],
            "phases": phases,
            "child_watcher": doc.get("child_watcher", ""),
        }


def phase_counts(phases: list[str], dumped: list[int], small: int, large: int) -> tuple[list[float], int]:
    """Instructions per step of each (small plan, large plan) pair, and the calibration loop's
    instructions, from ``bench/agent_steps.py count``: dump n holds phase n (``phases``, in order;
    the last dump, made at exit, holds what came after the last phase)."""
    if len(dumped) < len(phases):
        raise ValueError(f"{len(phases)} phases but {len(dumped)} dumps")
    by_phase = list(zip(phases, dumped, strict=False))
    smalls = [ir for name, ir in by_phase if name.startswith("small:")]
    larges = [ir for name, ir in by_phase if name.startswith("large:")]
    calibration = [ir for name, ir in by_phase if name == "calibration"]
    if not smalls or len(smalls) != len(larges) or len(calibration) != 1:
        raise ValueError(f"unexpected phases: {phases}")
    steps = [per_step(s, lg, small, large) for s, lg in zip(smalls, larges, strict=True)]
    if min(steps) <= 0:  # a count cannot shrink with more steps: the run went wrong, say so
        raise ValueError(f"instructions per step {steps}: the larger plan did not cost more")
    return steps, calibration[0]


# -- idle footprint ---------------------------------------------------------------------------------


@dataclass
class Idle:
    heartbeat: int
    ctl: Controller
    agent: Proc
    ticks0: float = 0.0
    ns0: int | None = None
    threads0: dict[str, int] = field(default_factory=dict)
    t0: float = 0.0

    def begin(self) -> None:
        self.ticks0, self.ns0, self.t0 = self.agent.cpu_seconds(), self.agent.cpu_ns(), time.monotonic()
        self.threads0 = self.agent.cpu_ns_by_thread() or {}

    def end(self) -> dict[str, Any]:
        ticks, ns, t = self.agent.cpu_seconds(), self.agent.cpu_ns(), time.monotonic()
        threads = self.agent.cpu_ns_by_thread() or {}
        by_thread = {k: round((v - self.threads0.get(k, 0)) / 1e6, 2) for k, v in threads.items()}
        window = t - self.t0
        by_ticks = ticks - self.ticks0
        # schedstat (exact) unless a thread ended in the window (then the ticks, 10 ms each)
        exact = (
            ns is not None
            and self.ns0 is not None
            and ns >= self.ns0
            and by_ticks <= (ns - self.ns0) / 1e9 + 0.02
        )
        cpu = (ns - self.ns0) / 1e9 if exact and ns is not None and self.ns0 is not None else by_ticks
        return {
            "heartbeat_s": self.heartbeat,
            "cpu_pct": 100 * cpu / window,
            "cpu_ms": 1000 * cpu,
            "cpu_ms_ticks": 1000 * by_ticks,
            "cpu_ms_per_heartbeat": 1000 * cpu / (window / self.heartbeat),
            "cpu_source": "schedstat" if exact else "stat ticks",
            "cpu_ms_by_thread": json.dumps(by_thread),
            "window_s": window,
            **memory(self.agent),
        }


def idle_agents(work: Path, env: str, steps: tuple[tuple[str, str], ...]) -> list[Idle]:
    """Two enrolled agents, one per controller (heartbeat 1 s and the default), that have run the
    plan and are idle."""
    out = []
    for hb in (SHORT_HEARTBEAT, DEFAULT_HEARTBEAT):
        cwork = work / f"idle-{hb}s"
        cwork.mkdir(parents=True, exist_ok=True)
        ctl = Controller(cwork, hb)
        ctl.start()
        ctl.apply(messages.environment_yaml(env, steps))
        node = f"idle-{hb}s"
        agent = start_agent(
            cwork, ctl, cwork / "state", node, "--token", ctl.token(env, 1), "--ca-hash", ctl.ca_hash()
        )
        out.append(Idle(hb, ctl, agent))
    for idle in out:
        wait_plan_run(idle.ctl, f"idle-{idle.heartbeat}s", 0, steps)
    return out


# -- the figures ------------------------------------------------------------------------------------


def agent_figures(work: Path, ctl: Controller, sizes: Sizes) -> list[Figure]:
    env = "overhead"
    steps = overhead_steps()
    ctl.apply(messages.environment_yaml(env, steps))
    real = real_agent(work, ctl, sizes, env, steps)
    log(
        f"  agent: plan {statistics.median(real.spans) * 1000:.0f} ms "
        f"(runs {[round(s * 1000) for s in real.spans]}), bash {[round(s * 1000) for s in real.bash]} ms"
    )
    timed = harness_time(work / "harness-time", real.scripts, sizes.overhead_pairs)
    log(f"  agent step path, wall clock: {sizes.overhead_pairs} agent/bash pairs")
    counting = Counting(work, real.scripts, sizes.callgrind_pairs) if callgrind.available() else None
    idle: list[Idle] = []
    try:
        idle = idle_agents(work, env, steps)
        time.sleep(2)  # the plan's last events acknowledged
        for i in idle:
            i.begin()
        log(
            f"  idle agents: {sizes.idle_window:.0f} s window "
            f"(heartbeats {SHORT_HEARTBEAT} s and {DEFAULT_HEARTBEAT} s)"
        )
        time.sleep(sizes.idle_window)
        footprint = [i.end() for i in idle]
    finally:
        for i in idle:
            i.agent.stop()
            i.ctl.stop()
    counted = counting.result() if counting is not None else None
    return figures(real, timed, counted, footprint)


def figures(
    real: RealAgent,
    timed: dict[str, Any],
    counted: dict[str, Any] | None,
    footprint: list[dict[str, Any]],
) -> list[Figure]:
    steps = timed["steps"]
    bash_wall = [p["wall_s"] for p in timed["bash"]]
    wall_diffs = [1000 * (a["wall_s"] - b) / steps for a, b in zip(timed["agent"], bash_wall, strict=True)]
    wall = statistics.median(wall_diffs)
    wall_ci = bootstrap_ci(wall_diffs)
    bash_ms = 1000 * statistics.median(bash_wall) / steps
    agent_cpu = [1000 * (p["user_s"] + p["sys_s"]) / steps for p in timed["agent"]]
    bash_cpu = [1000 * (p["user_s"] + p["sys_s"]) / steps for p in timed["bash"]]
    cpu, cpu_ci = statistics.median(agent_cpu), bootstrap_ci(agent_cpu)
    real_diffs = [1000 * (a - b) / OVERHEAD_STEPS for a, b in zip(real.spans, real.bash, strict=True)]
    measured: dict[str, Any] = {
        "steps": steps,
        "step_script": 'the rendered step around: echo "step N"',
        "bash_ms_per_step": bash_ms,
        "agent_cpu_ms_per_step": cpu,
        "agent_cpu_ms_per_step_ci95": json.dumps([round(x, 3) for x in cpu_ci]),
        "bash_cpu_ms_per_step": statistics.median(bash_cpu),
        "wall_overhead_ms_per_step": wall,
        "wall_overhead_ci95": json.dumps([round(x, 3) for x in wall_ci]),
        "real_agent_overhead_ms_per_step": statistics.median(real_diffs),
        "real_agent_cpu_ms_per_step": 1000 * statistics.median(real.cpu) / OVERHEAD_STEPS
        if real.cpu
        else None,
        "real_agent_pairs": len(real_diffs),
    }
    out: list[Figure] = []
    if counted is not None:
        instr = statistics.median(counted["agent_per_step"])
        bash_instr = counted["bash_per_step"]
        cal = timed["calibration"]
        per_round_s = [c / cal["rounds"] for c in cal["cpu_s"]]
        rate = counted["calibration_per_round"] / min(per_round_s)  # instructions per CPU second
        rate_median = counted["calibration_per_round"] / statistics.median(per_round_s)
        ms, pct = 1000 * instr / rate, 100 * instr / bash_instr
        counts: dict[str, Any] = {
            "agent_instructions_per_step": instr,
            "agent_instructions_per_step_runs": json.dumps([round(x) for x in counted["agent_per_step"]]),
            "bash_instructions_per_step": bash_instr,
            "instructions_per_second": rate,
            "instructions_per_second_at_median": rate_median,
            "ms_per_step_at_median_rate": 1000 * instr / rate_median,
            "calibration_cpu_ms": json.dumps(
                {k: round(v * 1000, 3) for k, v in spread(cal["cpu_s"]).items() if k != "n"}
            ),
            "calibration_rounds": cal["rounds"],
            "calibration_reps": len(cal["cpu_s"]),
            "child_watcher_counted": counted["child_watcher"],
            "what": "user-space instructions of the agent's step path per step (callgrind, "
            "(50-step plan - 10-step plan) / 40) at this CPU's fastest rate for the calibration loop: "
            "a lower bound for the time (no kernel work, warm caches); agent_cpu_ms_per_step is measured",
        }
        log(
            f"  agent: {instr / 1e6:.3f} M instructions/step "
            f"(runs {[round(x / 1e6, 3) for x in counted['agent_per_step']]}), "
            f"bash {bash_instr / 1e6:.2f} M/step ({pct:.1f}%); at {rate / 1e9:.2f} G/s: {ms:.3f} ms/step; "
            f"CPU {cpu:.2f} ms/step [{cpu_ci[0]:.2f}, {cpu_ci[1]:.2f}]; wall {wall:.2f} ms/step "
            f"[{wall_ci[0]:.2f}, {wall_ci[1]:.2f}] over bash {bash_ms:.2f} ms/step"
        )
        out += [
            Figure(
                "agent.overhead_ms_per_step",
                ms,
                "ms/step",
                bash_ms,
                f"<= {TARGET_MS:g} (instructions at the calibrated rate)",
                ms <= TARGET_MS,
                detail={**counts, **measured},
            ),
            Figure(
                "agent.overhead_pct",
                pct,
                "%",
                bash_instr,
                f"<= {TARGET_PCT:g} (instructions, agent / bash)",
                pct <= TARGET_PCT,
                ratio=1 + pct / 100,
                detail=counts,
            ),
            Figure(
                "agent.instructions_per_step",
                instr,
                "instructions/step",
                bash_instr,
                f"{TARGET_MS * rate / 1e3:,.0f} ({TARGET_MS:g} ms at the calibrated rate)",
                ms <= TARGET_MS,
                detail={
                    "runs": counts["agent_instructions_per_step_runs"],
                    "phases": json.dumps(counted["phases"]),
                    "baseline": f"bash -c running the same scripts: ({BASH_LARGE} - {BASH_SMALL} steps) "
                    f"/ {BASH_LARGE - BASH_SMALL}, every process it forks or executes",
                },
            ),
        ]
    else:
        err = "valgrind is not installed: no instruction counts (apt-get install valgrind)"
        out += [
            Figure("agent.overhead_ms_per_step", None, "ms/step", bash_ms, "", False, detail={"error": err}),
            Figure("agent.overhead_pct", None, "%", None, "", False, detail={"error": err}),
            Figure(
                "agent.instructions_per_step",
                None,
                "instructions/step",
                None,
                "",
                False,
                detail={"error": err},
            ),
        ]
    out += [
        Figure(
            "agent.cpu_ms_per_step",
            cpu,
            "ms/step",
            statistics.median(bash_cpu),
            f"<= {TARGET_MS:g}",
            cpu <= TARGET_MS,
            detail={"ci95_low": cpu_ci[0], "ci95_high": cpu_ci[1], "pairs": len(agent_cpu), **measured},
        ),
        Figure(
            "agent.wall_overhead_ms_per_step",
            wall,
            "ms/step",
            bash_ms,
            f"<= {TARGET_MS:g}",
            wall <= TARGET_MS,
            detail={"ci95_low": wall_ci[0], "ci95_high": wall_ci[1], "pairs": len(wall_diffs), **measured},
        ),
    ]
    short, default = footprint
    rss = max(short["rss_mib"], default["rss_mib"])
    out.append(
        Figure(
            "agent.rss_mib",
            rss,
            "MiB",
            bare_python_rss(),
            f"<= {TARGET_RSS_MIB:g} idle",
            rss <= TARGET_RSS_MIB,
            detail={
                "heartbeat_1s": json.dumps(short),
                "heartbeat_30s": json.dumps(default),
                "after_plan_restarted": json.dumps(real.restarted_memory),
                "first_start": json.dumps(real.first_memory),
                "what": "enrolled agents that ran the plan, idle; the larger of the two. Run as on a "
                f"node: {', '.join(NOT_IN_THE_BUNDLE)} (in this venv, not in the agent bundle) hidden",
                "baseline": "python3 that imported grpc, idle",
            },
        )
    )
    for name, idle in (("agent.idle_cpu_pct", default), ("agent.idle_cpu_pct_heartbeat_1s", short)):
        out.append(
            Figure(
                name,
                idle["cpu_pct"],
                "% of a core",
                None,
                f"<= {TARGET_IDLE_CPU_PCT:g} idle, heartbeat {idle['heartbeat_s']} s",
                idle["cpu_pct"] <= TARGET_IDLE_CPU_PCT,
                detail={
                    **{k: v for k, v in idle.items() if not k.endswith("_mib")},
                    "tick_ms": 1000 / CLK_TCK,
                    "what": "CPU of every thread over the window (schedstat, exact; else utime + stime "
                    "from /proc/PID/stat) / the window, an enrolled agent that ran the plan, idle",
                },
            )
        )
    return out


def failed(exc_text: str) -> list[Figure]:
    return [Figure(name, None, unit, None, "", False, detail={"error": exc_text}) for name, unit in NAMES]


__all__ = ["NAMES", "OVERHEAD_STEPS", "agent_figures", "failed", "overhead_steps"]
