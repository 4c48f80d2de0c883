"""Walks the node's plan: journal first, then run, then report.

Where the plan comes from (the gRPC session, a local file) is not its
business: it is handed plans and commands, and emits events into the outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from tether.nodeagent import logs
from tether.nodeagent.journal import Journal, JournalState
from tether.nodeagent.model import AgentTarget, Event, EventKind, Plan, Step, decoder, now_ms
from tether.nodeagent.outbox import Outbox
from tether.nodeagent.runner import Runner, StepResult, kill_leftovers
from tether.nodeagent.statedb import StateDB

log = logs.get_logger("tether.agent.executor")


class AgentUpgrade(Protocol):
    """Moves the agent to the version a plan names (``tether.nodeagent.upgrader.Upgrader``)."""

    def wanted(self, target: AgentTarget | None) -> bool: ...

    async def apply(self, target: AgentTarget) -> bool: ...  # True: the agent restarts into it


GateWaiter = Callable[[Step, int], Awaitable[Mapping[str, str]]]  # (step, attempt) -> secret env
SecretsSink = Callable[[str, Mapping[str, str], Mapping[str, str]], None]  # (step, secrets, outputs)
RETRY_BASE_SECONDS = 5.0


def plan_to_json(plan: Plan) -> str:
    return json.dumps(asdict(plan))


@decoder("plan")
def plan_from_json(text: str) -> Plan:
    doc = json.loads(text)
    steps = tuple(
        Step(
            **{
                **s,
                "env": dict(s["env"]),
                "secret_env": tuple(s["secret_env"]),
                "requested": dict(s.get("requested", {})),
            }
        )
        for s in doc["steps"]
    )
    return Plan(
        steps=steps,
        generation=doc["generation"],
        environment=doc["environment"],
        role=doc["role"],
        digest=doc["digest"],
        agent=AgentTarget(**doc["agent"]) if doc.get("agent") else None,
        deprovision=bool(doc.get("deprovision", False)),
    )


class Executor:
    def __init__(
        self,
        db: StateDB,
        runner: Runner,
        *,
        boot_id: Callable[[], str],
        reboot: Callable[[], Awaitable[None]],
        gate: GateWaiter,
        on_events: Callable[[], None] = lambda: None,
        on_secrets: SecretsSink = lambda step, secrets, outputs: None,
        base_env: Mapping[str, str] | None = None,
        retry_base_seconds: float = RETRY_BASE_SECONDS,
        upgrade: AgentUpgrade | None = None,
        deprovisioned: Callable[[Plan], Awaitable[None]] | None = None,
    ) -> None:
        self.db = db
        self.journal = Journal(db)
        self.outbox = Outbox(db)
        self.runner = runner
        self._boot_id = boot_id
        self._reboot = reboot
        self._gate = gate
        self._on_events = on_events
        self._on_secrets = on_secrets
        self._env = dict(base_env or {})
        self._retry_base = retry_base_seconds
        self.upgrade = upgrade
        self._deprovisioned = deprovisioned  # a reset plan's steps all ran: the agent goes
        self._wake = asyncio.Event()
        self._plan: Plan | None = None
        saved = db.get_meta("plan")
        if saved:
            self._plan = plan_from_json(saved)
        self.state = "idle"  # idle | running | waiting | succeeded | failed | rebooting | upgrading

    @property
    def plan(self) -> Plan | None:
        return self._plan

    # -- inputs -------------------------------------------------------------------------------

    def set_plan(self, plan: Plan) -> None:
        if (
            self._plan is not None
            and plan.digest == self._plan.digest
            and plan.generation == self._plan.generation
        ):
            return
        self.db.set_meta("plan", plan_to_json(plan))
        self._plan = plan
        self.state = "idle"
        self.emit(
            Event(
                kind=EventKind.INFO,
                message=f"plan generation {plan.generation} received "
                f"({len(plan.steps)} steps, digest {plan.digest[:12]})",
                plan_generation=plan.generation,
            )
        )
        self._wake.set()

    def wake(self) -> None:
        """Walk the plan again (a retry of the agent upgrade is due, say)."""
        self._wake.set()

    def set_env(self, env: Mapping[str, str]) -> None:
        """Environment every step gets (node name, environment, role)."""
        self._env = dict(env)

    def rerun(self, steps: list[str]) -> int:
        plan = self._plan
        if plan is None:
            return 0
        digests = [s.digest for s in plan.steps if not steps or s.name in steps]
        forgotten = self.journal.forget(digests)
        self.state = "idle"
        self.emit(
            Event(kind=EventKind.INFO, message=f"rerun requested for {', '.join(steps) or 'all steps'}")
        )
        self._wake.set()
        return forgotten

    # -- events -------------------------------------------------------------------------------

    def emit(self, *events: Event) -> list[Event]:
        stamped = self.outbox.append(list(events))
        self._on_events()
        return stamped

    # -- the loop -----------------------------------------------------------------------------

    async def run_forever(self) -> None:
        removed = self.runner.remove_leftover_workdirs()
        if removed:
            log.info("removed work directories left by an earlier run of this agent", count=removed)
        while True:
            self._wake.clear()
            plan = self._plan
            if plan is not None:
                with logs.bound(plan_generation=plan.generation):
                    await self._walk(plan)
            if self._plan is plan:
                await self._wake.wait()

    async def _walk(self, plan: Plan) -> None:
        self.state = "running"
        for step in plan.steps:
            if self._plan is not plan:
                return  # a new plan arrived: start over with it
            await self._upgrade_between_steps(plan)
            with logs.bound(step=step.name):
                outcome = await self._visit(plan, step)
            if outcome == "stop":
                return
        await self._upgrade_between_steps(plan)
        self.state = "succeeded"
        log.info("plan complete", steps=len(plan.steps), digest=plan.digest[:12])
        if plan.deprovision and self._deprovisioned is not None:
            await self._deprovisioned(plan)  # reports the reset, then the agent removes itself

    async def _upgrade_between_steps(self, plan: Plan) -> None:
        """Move to the plan's agent version before the next step (never in the middle of one); once
        the agent restarts into it, no step starts here again."""
        if self.upgrade is None or not self.upgrade.wanted(plan.agent):
            return
        assert plan.agent is not None
        state, self.state = self.state, "upgrading"
        if await self.upgrade.apply(plan.agent):
            await asyncio.Event().wait()  # until the agent stops (it is exiting for the restart)
        self.state = state

    async def _visit(self, plan: Plan, step: Step) -> str:
        """Returns "next" to go on, or "stop"."""
        entry = self.journal.get(step.digest)
        if entry is not None and entry.state is JournalState.SUCCEEDED:
            if entry.plan_digest != plan.digest:
                with self.db.transaction(durable=False):
                    self.journal.seen_in_plan(step.digest, plan.digest)
                    self.emit(
                        Event(
                            kind=EventKind.SKIPPED,
                            step=step.name,
                            digest=step.digest,
                            plan_generation=plan.generation,
                            message="already succeeded with this digest; not run again",
                        )
                    )
            return "next"
        if entry is not None and entry.state is JournalState.REBOOTING:
            if self._boot_id() != entry.boot_id:
                self._transition(
                    plan,
                    step,
                    JournalState.SUCCEEDED,
                    EventKind.SUCCEEDED,
                    attempt=entry.attempt,
                    message="node rebooted; step complete",
                )
                log.info("reboot complete")
                return "next"
            await self._do_reboot(plan, step)
            return "stop"
        if entry is not None and entry.state is JournalState.RUNNING:
            killed = kill_leftovers(self.runner.script_path(step))
            log.warning("resuming an interrupted step", attempt=entry.attempt, leftover_groups_killed=killed)
        result = await self._run_with_retries(plan, step)
        if result is None:
            return "stop"  # woken at a gate for a new plan or a rerun
        if result.ok:
            if step.reboot and result.reboot_needed:
                await self._do_reboot(plan, step)  # the journal already says REBOOTING
                return "stop"
            return "next"
        if step.continue_on_error:
            log.warning("step failed; continuing (continueOnError)", exit_code=result.exit_code)
            return "next"
        self.state = "failed"
        log.error("step failed; plan stopped", exit_code=result.exit_code, error=result.error)
        return "stop"

    async def _wait_gate(self, plan: Plan, step: Step, attempt: int) -> Mapping[str, str] | None:
        """The secret values a gated step runs with, or None when woken for a new plan or a rerun.

        Asked again for every attempt: a retry must not reuse material the cluster refused.
        """
        self.state = "waiting"
        self.emit(
            Event(
                kind=EventKind.WAITING,
                step=step.name,
                digest=step.digest,
                attempt=attempt,
                plan_generation=plan.generation,
                message=f"waiting for gate {step.gate}",
            )
        )
        gate_task = asyncio.ensure_future(self._gate(step, attempt))
        wake_task = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({gate_task, wake_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wake_task.cancel()
        if not gate_task.done():
            gate_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gate_task
            return None
        self.state = "running"
        return gate_task.result()

    async def _run_with_retries(self, plan: Plan, step: Step) -> StepResult | None:
        attempts = step.retries + 1
        result = StepResult(exit_code=-1, duration_seconds=0.0, error="not run")
        for attempt in range(1, attempts + 1):
            secrets: Mapping[str, str] = {}
            if step.gate:
                released = await self._wait_gate(plan, step, attempt)
                if released is None:
                    return None
                secrets = released
            # Not fsync'd: the power takes the step's own work with this record, and the step
            # then simply runs again. The event goes out only once on disk (Session._writer).
            self._transition(
                plan, step, JournalState.RUNNING, EventKind.STARTED, attempt=attempt, durable=False
            )
            log.info("step started", attempt=attempt)

            def output(lines: list[str], _attempt: int = attempt) -> Event:
                return Event(
                    kind=EventKind.OUTPUT,
                    step=step.name,
                    digest=step.digest,
                    attempt=_attempt,
                    lines=tuple(lines),
                    plan_generation=plan.generation,
                    time_ms=now_ms(),  # stamped here, the outbox need not copy it to stamp it
                )

            async def sink(lines: list[str]) -> None:
                self.emit(output(lines))

            # The output still buffered when the step ends is recorded with its result: one
            # durable commit instead of two (most steps print less than one batch).
            tail: list[str] = []

            async def last(lines: list[str], _tail: list[str] = tail) -> None:
                _tail.extend(lines)

            result = await self.runner.run(
                step, sink, secret_env=secrets, extra_env=self._env, final_output=last
            )
            if result.ok and (result.secrets or result.outputs):
                self._on_secrets(step.name, result.secrets, result.outputs)
            final = attempt == attempts or result.ok
            if result.ok:
                state = JournalState.SUCCEEDED
            else:
                state = JournalState.FAILED if final else JournalState.RUNNING
            kind = EventKind.SUCCEEDED if result.ok else EventKind.FAILED
            reboot = result.ok and step.reboot and result.reboot_needed
            if reboot:
                kind = EventKind.INFO  # the SUCCEEDED event comes after the reboot
                state = JournalState.REBOOTING
            message = result.error or ("" if result.ok else f"exit code {result.exit_code}")
            if not result.ok and not final:
                message += f"; retrying (attempt {attempt + 1} of {attempts})"
            # A success is fsync'd with the next event that leaves the node (or the next durable
            # commit), not here: after a power cut a step whose success was not on disk yet runs
            # again, like one that was cut short. A reboot must find its record on disk.
            self._transition(
                plan,
                step,
                state,
                kind,
                attempt=attempt,
                durable=reboot or not result.ok,
                before=[output(tail)] if tail else [],
                exit_code=result.exit_code,
                observed=dict(result.observed),
                duration_seconds=round(result.duration_seconds, 3),
                will_retry=not result.ok and not final,
                message=message or ("rebooting to finish the step" if reboot else ""),
            )
            log.info(
                "step finished",
                attempt=attempt,
                exit_code=result.exit_code,
                duration=round(result.duration_seconds, 3),
            )
            if result.ok or final:
                return result
            await asyncio.sleep(min(self._retry_base * (2 ** (attempt - 1)), 60.0))
        return result

    async def _do_reboot(self, plan: Plan, step: Step) -> None:
        entry = self.journal.get(step.digest)
        attempt = entry.attempt if entry else 1
        self.state = "rebooting"
        log.warning("rebooting the node")
        try:
            await self._reboot()
        except Exception as exc:  # the node did not go down: say so, and stop here
            self.state = "failed"
            log.error("reboot failed", error=str(exc))
            self._transition(
                plan,
                step,
                JournalState.FAILED,
                EventKind.FAILED,
                attempt=attempt,
                message=f"reboot failed: {exc}",
            )

    def _transition(
        self,
        plan: Plan,
        step: Step,
        state: JournalState,
        kind: EventKind,
        *,
        attempt: int,
        durable: bool = True,
        exit_code: int = 0,
        before: Sequence[Event] = (),
        **event: Any,
    ) -> None:
        """Journal ``state`` for ``step`` and emit ``before`` and its ``kind`` event, in one commit."""
        with self.db.transaction(durable=durable):
            self.journal.record(
                step.digest,
                step.name,
                state,
                attempt=attempt,
                exit_code=exit_code,
                boot_id=self._boot_id(),
                plan_digest=plan.digest,
            )
            self.emit(
                *before,
                Event(
                    kind=kind,
                    step=step.name,
                    digest=step.digest,
                    attempt=attempt,
                    exit_code=exit_code,
                    plan_generation=plan.generation,
                    time_ms=now_ms(),
                    **event,
                ),
            )

    async def run_task(self, step: Step) -> StepResult:
        """Run a step outside the plan (not journaled), e.g. to refresh join material."""
        task_name = f"task:{step.name}"

        async def sink(lines: list[str]) -> None:
            self.emit(Event(kind=EventKind.OUTPUT, step=task_name, digest=step.digest, lines=tuple(lines)))

        self.emit(Event(kind=EventKind.STARTED, step=task_name, digest=step.digest, attempt=1))
        result = await self.runner.run(step, sink, extra_env=self._env)
        self.emit(
            Event(
                kind=EventKind.SUCCEEDED if result.ok else EventKind.FAILED,
                step=task_name,
                digest=step.digest,
                attempt=1,
                exit_code=result.exit_code,
                duration_seconds=round(result.duration_seconds, 3),
                message=result.error,
            )
        )
        return result


def scripts_dir(state_dir: Path) -> Path:
    return state_dir / "scripts"
