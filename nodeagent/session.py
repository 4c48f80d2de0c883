"""The agent's lifecycle: enroll once, then keep one stream to the controller.

States (``AgentState``): ENROLLING -> CONNECTING -> STREAMING, with BACKOFF
between attempts and DRAINING on shutdown. The plan keeps running while the
stream is down; events wait in the outbox and go out on the next stream.

With several controller replicas (``tether.nodeagent.controllers``), each failed attempt moves to
the next address, after the same backoff; a refusal that is final (this node revoked, a CA that is
not the pinned one) stops the agent as with one. Another replica's Welcome says which events it
holds (``stored_seq``), and the outbox resends from there.

Inbound messages are dispatched on their ``oneof`` kind; a kind this agent
does not know (a newer controller) is logged and ignored, so controllers can
be upgraded before agents.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import enum
import random
import sqlite3
import time
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from tether.nodeagent import __version__, facts, logs, systemd, wire
from tether.nodeagent.certinfo import read_certinfo
from tether.nodeagent.channel import secure_channel
from tether.nodeagent.config import AgentConfig
from tether.nodeagent.controllers import Rotation, welcome_addresses
from tether.nodeagent.errors import (
    AgentError,
    ControllerUnavailable,
    EnrollError,
    IdentityError,
    NodeReset,
    NodeRevoked,
)
from tether.nodeagent.executor import Executor, scripts_dir
from tether.nodeagent.identity import Identity, IdentityStore, make_csr
from tether.nodeagent.limits import (
    EVENT_BATCH_COUNT,
    MAX_NOTICE_MESSAGE,
    MAX_NOTICE_STEP,
    RESET_REPORT_SECONDS,
)
from tether.nodeagent.model import AgentTarget, Event, EventKind, HostFacts, Plan, Step
from tether.nodeagent.renewal import RenewalRule
from tether.nodeagent.runner import Runner
from tether.nodeagent.secrets import PROCESS_REDACTOR
from tether.nodeagent.statedb import DB_NAME, StateDB, state_error
from tether.nodeagent.supervise import Supervisor, local_fault
from tether.nodeagent.upgrade import Install
from tether.nodeagent.upgrader import Upgrader

if TYPE_CHECKING:
    from tether.nodeagent.textfile import TextfileWriter

# What an enrolled agent does not do while it runs its plan and reports (enrolling, a reset's
# removal, an upgrade's download, the metrics textfile when not configured) is imported where it
# is done: every module an idle agent holds costs it resident memory (docs/performance.md, the
# agent footprint; tests/unit/nodeagent/test_footprint.py lists them).

log = logs.get_logger("tether.agent")

EVENT_BATCH = EVENT_BATCH_COUNT  # bench/sim.py batches like the agent
# A stream that lasted this long resets the backoff (one that dies at once does not).
STABLE_STREAM_SECONDS = 10.0
# The longest a controller's retry hint can hold the agent off (a wrong one must not park it).
RETRY_HINT_MAX_SECONDS = 300.0


def retry_hint(exc: grpc.aio.AioRpcError) -> float:
    """The seconds a RESOURCE_EXHAUSTED refusal says to wait (``retry-after-seconds``), capped."""
    if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return 0.0
    for key, value in exc.trailing_metadata() or ():
        if key == "retry-after-seconds":
            try:
                return min(max(float(value), 0.0), RETRY_HINT_MAX_SECONDS)
            except (TypeError, ValueError):
                return 0.0
    return 0.0


class AgentState(str, enum.Enum):
    ENROLLING = "enrolling"
    CONNECTING = "connecting"
    STREAMING = "streaming"
    BACKOFF = "backoff"
    DRAINING = "draining"


class Backoff:
    """Exponential backoff with full jitter."""

    def __init__(self, base: float = 0.5, cap: float = 30.0) -> None:
        self.base, self.cap, self.attempt = base, cap, 0

    def next_delay(self) -> float:
        delay = random.uniform(0, min(self.cap, self.base * (2**self.attempt)))
        self.attempt = min(self.attempt + 1, 30)
        return delay

    def reset(self) -> None:
        self.attempt = 0


class StreamClosed(Exception):
    pass


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.state_dir = config.state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.identities = IdentityStore(self.state_dir)
        self.controllers = Rotation(
            () if config.controllers_remembered else config.controllers, self.identities.controllers()
        )
        self.db = StateDB(self.state_dir / DB_NAME)
        self.redactor = PROCESS_REDACTOR
        self.redactor.add(config.token)  # a step that prints the join token shows [REDACTED]
        self.runner = Runner(
            scripts_dir(self.state_dir), self.redactor, shell=config.shell, cwd=self.state_dir / "workspace"
        )
        self.backoff = Backoff(cap=config.backoff_max_seconds)
        self.heartbeat = config.heartbeat_seconds
        self.state = AgentState.ENROLLING
        self.identity: Identity | None = None
        self._kick = asyncio.Event()
        self._health_now = asyncio.Event()  # a stream came up: report health without waiting
        self._control: asyncio.Queue[wire.pb.AgentMessage] = asyncio.Queue()
        self._gates: dict[str, asyncio.Future[Mapping[str, str]]] = {}
        self._gate_digests: dict[str, tuple[str, int]] = {}  # step -> (digest, attempt)
        self._gate_facts: dict[str, HostFacts] = {}  # step -> the facts when it was reached
        # Step secrets until acknowledged: (serial, last event seq emitted before them, message).
        self._unacked_secrets: dict[str, tuple[int, int, wire.pb.StepSecrets]] = {}
        self._secrets_serial = 0
        self._streaming = False
        self.last_connected = 0.0  # Unix time the stream was last seen up (the metrics textfile)
        self.textfile: TextfileWriter | None = None
        if config.metrics_textfile:
            from tether.nodeagent.textfile import TextfileWriter

            self.textfile = TextfileWriter(config.metrics_textfile)
        self._ready_sent = False
        self.supervisor = Supervisor(self.state_dir)
        self._renewal = RenewalRule()
        self.reexec_after_enrolling = False
        self.reexec = False
        self.restarting_into = ""  # the version this agent exits to be restarted into
        self._upgrading = asyncio.Event()
        # A reset (Plan.deprovision): its last event is out, then the agent removes itself.
        self.config_file: Path | None = None  # the config it was started with (removed by a reset)
        self._reset_reported = False
        self._forgotten = False  # the controller refuses this node after its reset: it was heard
        self._reset_finished = asyncio.Event()
        self.reset_done = False
        self._tasks_running = 0
        self._no_task = asyncio.Event()
        self._no_task.set()
        self.upgrader = Upgrader(
            Install.find(),
            emit=lambda event: self.executor.emit(event),
            fetch=self._fetch_bundle,
            restart=self._restart_for_upgrade,
            wake=lambda: self.executor.wake(),
            quiet=self._no_tasks,
        )
        boot_id = facts.boot_id()  # fixed for the life of this process: a reboot ends it
        self.executor = Executor(
            self.db,
            self.runner,
            boot_id=lambda: boot_id,
            reboot=self._reboot,
            gate=self._wait_gate,
            on_events=self._kick.set,
            on_secrets=self._on_step_secrets,
            upgrade=self.upgrader,
            deprovisioned=self._finish_reset,
        )

    # -- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Enroll if needed, then stream until cancelled.

        With ``reexec_after_enrolling``, returns right after a first enrollment with ``reexec`` set:
        the caller execs the agent again, which then starts with its identity and without the
        crypto library and enrollment channel (about 15 MiB) held for the rest of its life.
        """
        try:
            enrolling = not self.identities.exists()
            self.identity = await self._ensure_enrolled()
            if enrolling and self.reexec_after_enrolling:
                log.info("enrolled; restarting the agent in place (same PID) to leave enrollment behind")
                self.reexec = True
                return
            await self._start(self.identity)
            try:
                await self._until_stopped()
            except AgentError as exc:
                await self._report_failure(str(exc))
                raise
        finally:
            self._set_state(AgentState.DRAINING)
            await self.supervisor.stop()
            self.db.close()
        if self.reset_done:
            await self._remove_self()

    async def _until_stopped(self) -> None:
        """Until a watched task fails (its error is raised) or the agent restarts into a new version."""
        failed = asyncio.ensure_future(self.supervisor.wait())
        upgrading = asyncio.ensure_future(self._upgrading.wait())
        reset = asyncio.ensure_future(self._reset_finished.wait())
        try:
            await asyncio.wait({failed, upgrading, reset}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            upgrading.cancel()
            reset.cancel()
            if not failed.done():
                failed.cancel()
        if failed.done() and not failed.cancelled():
            failed.result()  # raises the failure
        if self.reset_done:
            return  # the controller holds the reset's last event: the agent removes itself now
        log.info("exiting to be restarted into the new agent version", version=self.restarting_into)
        await self._drain_outbox(10.0)  # the controller hears why the stream goes away

    async def _finish_reset(self, plan: Plan) -> None:
        """Every step of a reset plan ran: say so, wait (bounded) until the controller holds it,
        then stop the agent, which removes itself (``_remove_self``)."""
        from tether.nodeagent import deprovision

        self._reset_reported = True
        self.executor.emit(
            Event(
                kind=EventKind.INFO,
                step=deprovision.RESET_DONE_STEP,
                plan_generation=plan.generation,
                message="reset done: the agent removes its unit, config and state",
            )
        )
        for _ in range(int(RESET_REPORT_SECONDS / 0.1)):  # also across a reconnect
            if not self.executor.outbox.count() or self._forgotten:
                break
            await asyncio.sleep(0.1)
        if self.executor.outbox.count() and not self._forgotten:
            log.warning("the controller did not confirm the reset in time; the agent removes itself anyway")
        self.reset_done = True
        self._reset_finished.set()
        await asyncio.Event().wait()  # until the agent stops

    async def _remove_self(self) -> None:
        """Remove the unit, install, config and state (the state database is closed by now)."""
        from tether.nodeagent import deprovision

        node = self.identity.node_name if self.identity else "this node"
        removal = await asyncio.to_thread(
            deprovision.plan_removal, self.state_dir, self.config_file, install=Install.find()
        )
        problems = await asyncio.to_thread(deprovision.remove, removal)
        for problem in problems:
            log.warning("could not remove", what=problem)
        left = f" (could not remove: {'; '.join(problems)})" if problems else ""
        raise NodeReset(f"node {node} was reset: removed {removal.describe()}{left}")

    def _restart_for_upgrade(self, version: str) -> None:
        self.restarting_into = version
        self._upgrading.set()

    async def _no_tasks(self) -> None:
        """Until no command's task runs (the restart would kill it with the unit's cgroup)."""
        await self._no_task.wait()

    async def _fetch_bundle(self, target: AgentTarget, dest: Path) -> None:
        from tether.nodeagent import bundlefetch

        await bundlefetch.fetch(self.controllers.current, self.identities.load(), target, dest)

    async def _run_plan(self) -> None:
        """The executor; a new agent version on probation runs no step until it has committed (a
        rollback restarts the agent, which would kill a running step)."""
        await self.upgrader.committed.wait()
        await self.executor.run_forever()

    async def _start(self, identity: Identity) -> None:
        """Start the long-lived tasks, each under the supervisor."""
        logs.bind(node=identity.node_name)
        addresses = await asyncio.to_thread(facts.local_addresses, self.controllers.current)
        self.executor.set_env(
            {
                "TETHER_NODE": identity.node_name,
                "TETHER_ENVIRONMENT": identity.environment,
                "TETHER_ROLE": identity.role,
                # The address this node uses to reach the controller: kubeadm advertises it.
                "TETHER_NODE_IP": addresses[0] if addresses else "",
            }
        )
        self.upgrader.announce()
        self.supervisor.watch(self.upgrader.guard_probation(), "upgrade", forever=False)
        self.supervisor.watch(self._run_plan(), "executor")
        self.supervisor.watch(self._health_loop(), "health")
        if systemd.watchdog_interval():
            self.supervisor.watch(self._watchdog_loop(), "watchdog")
        self.supervisor.watch(self._connect_forever(), "stream")
        self._notify_ready()

    async def _report_failure(self, line: str) -> None:
        """Best effort: tell the controller why this agent stops (the disk may take the event)."""
        try:
            self.executor.emit(Event(kind=EventKind.INFO, message=f"agent stopping: {line}"))
        except Exception as exc:  # a full disk, most likely: the log line is all there is
            log.warning("could not report the failure to the controller", error=str(exc))
            return
        await self._drain_outbox(3.0)

    async def _drain_outbox(self, seconds: float) -> None:
        """Wait (at most ``seconds``) for the controller to hold every event, while streaming."""
        for _ in range(int(seconds / 0.1)):
            if self.executor.outbox.count() == 0 or not self._streaming:
                return
            await asyncio.sleep(0.1)

    def _set_state(self, state: AgentState) -> None:
        if state is not self.state:
            self.state = state
            systemd.notify(f"STATUS={state.value}")
            log.debug("agent state", state=state.value)

    def _notify_ready(self) -> None:
        if not self._ready_sent:
            systemd.notify("READY=1")
            self._ready_sent = True

    async def _ensure_enrolled(self) -> Identity:
        if self.identities.exists():
            identity = self.identities.load()
            log.info("using stored identity", node=identity.node_name, environment=identity.environment)
            return identity
        from tether.nodeagent.enroll import enroll

        self._set_state(AgentState.ENROLLING)
        while True:
            try:
                node_facts = await asyncio.to_thread(facts.collect_facts, self.controllers.current)
                identity, next_seq = await enroll(self.config, self.identities, node_facts, self.controllers)
                self.executor.outbox.start_at(next_seq)
                return identity
            except (EnrollError, IdentityError):
                raise
            except (ControllerUnavailable, grpc.aio.AioRpcError, OSError) as exc:
                delay = self.backoff.next_delay()
                log.warning(
                    "controller unavailable for enrollment; retrying",
                    controller=self.controllers.current,
                    error=str(exc),
                    retry_in=round(delay, 2),
                    next=self.controllers.advance(),
                )
                await asyncio.sleep(delay)

    # -- the stream ---------------------------------------------------------------------------

    async def _connect_forever(self) -> None:
        while True:
            self._set_state(AgentState.CONNECTING)
            logs.bind(controller=self.controllers.current)  # this task's lines say which replica
            started = time.monotonic()
            hint = 0.0
            try:
                await self._stream_once()
                log.info("stream closed by the controller; reconnecting")
            except grpc.aio.AioRpcError as exc:
                hint = retry_hint(exc)
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    # Refused at Connect only for a revoked or deleted node (a superseded certificate
                    # is UNAUTHENTICATED, a restarting controller UNAVAILABLE): nothing to retry.
                    log.error("controller refused this node", code=exc.code().name, error=exc.details())
                    if self._reset_reported:
                        self._forgotten = True  # it forgot the node after hearing of its reset
                        await asyncio.Event().wait()
                    name = self.identity.node_name if self.identity else self.config.node_name
                    raise NodeRevoked(name) from None
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    log.error("controller refused this node", code=exc.code().name, error=exc.details())
                else:
                    log.warning(
                        "stream lost", code=exc.code().name, error=exc.details(), retry_in=hint or None
                    )
            except (StreamClosed, ControllerUnavailable, OSError, asyncio.InvalidStateError) as exc:
                # InvalidStateError: a write on a call that the transport already failed.
                if local_fault(exc):
                    raise
                log.warning("stream lost", error=str(exc) or type(exc).__name__)
            except IdentityError:
                raise
            except Exception as exc:  # never let one bad stream take the agent (and the running plan) down
                if local_fault(exc):
                    raise  # this host's database or disk: no reconnect mends it (the supervisor says so)
                log.exception("unexpected error on the stream; reconnecting")
            finally:
                self._streaming = False
            if time.monotonic() - started >= STABLE_STREAM_SECONDS:
                self.backoff.reset()  # it worked for a while: the next attempt starts quick again
            self._set_state(AgentState.BACKOFF)
            self.controllers.advance()  # another replica, if there are several
            await asyncio.sleep(max(self.backoff.next_delay(), hint))  # a refusal's hint is a floor

    async def _stream_once(self) -> None:
        identity = self.identities.load()
        self.identity = identity
        address = self.controllers.current
        async with secure_channel(address, identity.ca_pem, identity.key_pem, identity.cert_pem) as channel:
            call = wire.AgentServiceStub(channel).Connect()
            await call.write(wire.pb.AgentMessage(hello=await self._hello()))
            first = await call.read()
            if not isinstance(first, wire.pb.ControllerMessage) or first.WhichOneof("kind") != "welcome":
                raise StreamClosed("the controller did not welcome this node")
            stored = first.welcome.stored_seq
            self.executor.outbox.start_at(stored + 1)
            self.executor.outbox.ack(stored)
            self._streaming = True
            self.last_connected = time.time()
            self._set_state(AgentState.STREAMING)
            self._health_now.set()  # the controller sees fresh health (and an upgrade commits) at once
            await self._remember_controllers(first.welcome.controllers)
            log.info(
                "streaming",
                controller=address,
                stored_seq=stored,
                outbox=self.executor.outbox.count(),
            )
            self._maybe_renew(identity)
            writer = asyncio.create_task(self._writer(call, stored), name="writer")
            try:
                while True:
                    reader = asyncio.ensure_future(call.read())
                    done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
                    if writer in done:
                        reader.cancel()
                        writer.result()  # raises what broke the writer
                        return
                    msg = reader.result()
                    if not isinstance(msg, wire.pb.ControllerMessage):  # grpc.aio.EOF
                        return
                    await self._dispatch(msg)
            finally:
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await writer
                call.cancel()

    async def _remember_controllers(self, listed: Sequence[str]) -> None:
        """The live replicas a Welcome lists replace the remembered ones (and become the order to
        try them in); a Welcome that lists none leaves them, and the address that welcomed this
        node goes first. A restart without ``--controller`` uses what is remembered."""
        replicas = welcome_addresses(listed)
        try:
            if self.controllers.welcomed(replicas):
                if await asyncio.to_thread(self.identities.set_controllers, replicas):
                    log.info("controller replicas", controllers=",".join(replicas))
            else:
                await asyncio.to_thread(self.identities.remember_controller, self.controllers.current)
        except (OSError, ValueError, IdentityError) as exc:
            log.warning("could not remember the controller addresses", error=str(exc))

    async def _hello(self) -> wire.pb.Hello:
        """What this node says first on a stream: its facts, outbox numbers, plan and journal."""
        node_facts = await asyncio.to_thread(facts.collect_facts, self.controllers.current)
        plan = self.executor.plan
        return wire.pb.Hello(
            agent_version=__version__,
            facts=wire.facts_to_pb(node_facts),
            last_acked_seq=self.executor.outbox.acked_seq,
            next_seq=self.executor.outbox.next_seq,
            plan_digest=plan.digest if plan else "",
            plan_generation=plan.generation if plan else 0,
            journal=[
                wire.pb.StepState(step=e.step, digest=e.digest, state=e.state.value)
                for e in self.executor.journal.entries()
            ],
            upgraded_from=self.upgrader.upgraded_from,
            rolled_back_from=self.upgrader.rolled_back_from,
        )

    async def _writer(self, call: grpc.aio.StreamStreamCall, stored_seq: int) -> None:  # type: ignore[type-arg]
        last_sent = stored_seq
        sent_secrets: set[int] = set()  # serials written on this stream
        if self._gate_digests:  # asked again on a new stream, with what the node has now
            now = await asyncio.to_thread(facts.collect_facts, self.controllers.current)
            self._gate_facts.update((name, now) for name in self._gate_facts)
        for name, (digest, attempt) in list(self._gate_digests.items()):  # acks may change them meanwhile
            await call.write(wire.pb.AgentMessage(gate=self._gate_request(name, digest, attempt)))
        while True:
            self._kick.clear()
            while not self._control.empty():
                msg = self._control.get_nowait()
                await call.write(msg)
                if msg.WhichOneof("kind") == "health":
                    self.upgrader.healthy()  # welcomed and reporting: a new version stays
            await self._write_secrets(call, last_sent, sent_secrets)
            # Bounded in bytes (EVENT_BATCH_BYTES) and in events, far below the controller's limit,
            # and never past the events a step's secrets wait for (they go out right after them).
            events = self.executor.outbox.pending(after_seq=last_sent, up_to=self._secrets_due(sent_secrets))
            if events:
                # Only what is on disk leaves the node: a power cut must not take back an event
                # the controller holds (its number would be given to another one).
                await self.executor.db.sync()
                await call.write(wire.pb.AgentMessage(events=wire.events_to_pb(events)))
                last_sent = events[-1].seq
                continue
            await self._kick.wait()

    def _secrets_due(self, sent: set[int]) -> int | None:
        """The seq of the last event before the first step secrets not yet written on this stream."""
        waiting = [after for serial, after, _ in self._unacked_secrets.values() if serial not in sent]
        return min(waiting) if waiting else None

    async def _write_secrets(
        self,
        call: grpc.aio.StreamStreamCall,  # type: ignore[type-arg]
        last_sent: int,
        sent: set[int],
    ) -> None:
        """Step secrets go out only after every event emitted before them: the controller accepts
        a step's material only while it knows the step is running (its STARTED event)."""
        for serial, after_seq, msg in list(self._unacked_secrets.values()):
            if serial not in sent and after_seq <= last_sent:
                await call.write(wire.pb.AgentMessage(secrets=msg))
                sent.add(serial)

    def _send(self, msg: wire.pb.AgentMessage) -> None:
        if self._streaming:
            self._control.put_nowait(msg)
            self._kick.set()

    async def _dispatch(self, msg: wire.pb.ControllerMessage) -> None:
        kind = msg.WhichOneof("kind")
        if kind == "plan":
            self.executor.set_plan(wire.plan_from_pb(msg.plan))
        elif kind == "ack":
            self.executor.outbox.ack(msg.ack.seq)
            for step in msg.ack.secrets:
                self._unacked_secrets.pop(step, None)
        elif kind == "release":
            r = msg.release
            self._release(r.step, r.digest, dict(r.secret_env), dict(r.env))
        elif kind == "command":
            self._command(msg.command)
        elif kind == "settings":
            if msg.settings.heartbeat_seconds:
                self.heartbeat = float(msg.settings.heartbeat_seconds)
        elif kind == "certificate":
            pem = msg.certificate.certificate_pem
            self.identities.save_certificate(pem)
            self.identity = self.identities.load()
            self._renewal.received(read_certinfo(pem), dt.datetime.now(dt.timezone.utc))
            log.info("certificate renewed")
        elif kind == "welcome":
            pass
        elif kind == "notice":
            self._notice(msg.notice.step, msg.notice.digest, msg.notice.message)
        else:
            log.warning("ignoring a message kind this agent does not know", kind=kind)

    # -- gates, secrets, commands -------------------------------------------------------------

    async def _wait_gate(self, step: Step, attempt: int) -> Mapping[str, str]:
        fut = self._gates.get(step.name)
        if fut is None or fut.done():
            fut = asyncio.get_running_loop().create_future()
            self._gates[step.name] = fut
        # What the node has now goes with the request: a hardware gate decides on it.
        node_facts = await asyncio.to_thread(facts.collect_facts, self.controllers.current)
        self._gate_facts[step.name] = node_facts
        self._gate_digests[step.name] = (step.digest, attempt)
        self._send(wire.pb.AgentMessage(gate=self._gate_request(step.name, step.digest, attempt)))
        try:
            return await fut
        finally:
            self._gates.pop(step.name, None)
            self._gate_digests.pop(step.name, None)
            self._gate_facts.pop(step.name, None)

    def _gate_request(self, step: str, digest: str, attempt: int) -> wire.pb.GateRequest:
        request = wire.pb.GateRequest(step=step, digest=digest, attempt=attempt)
        node_facts = self._gate_facts.get(step)
        if node_facts is not None:
            request.facts.CopyFrom(wire.facts_to_pb(node_facts))
        return request

    def _release(self, step: str, digest: str, secret_env: dict[str, str], env: dict[str, str]) -> None:
        self.redactor.add(*secret_env.values())
        fut = self._gates.get(step)
        pending = self._gate_digests.get(step)
        if fut is not None and not fut.done() and pending is not None and pending[0] == digest:
            fut.set_result({**env, **secret_env})

    def _notice(self, step: str, digest: str, message: str) -> None:
        """The controller's word on this node, recorded as an INFO event (its own seq)."""
        plan = self.executor.plan
        self.executor.emit(
            Event(
                kind=EventKind.INFO,
                step=step[:MAX_NOTICE_STEP],
                digest=digest[:MAX_NOTICE_STEP],
                message=self.redactor.redact(message[:MAX_NOTICE_MESSAGE]),
                plan_generation=plan.generation if plan else 0,
            )
        )

    def _on_step_secrets(
        self, step: str, values: Mapping[str, str], outputs: Mapping[str, str], command_id: str = ""
    ) -> None:
        key = command_id or step
        msg = wire.pb.StepSecrets(
            step=step, values=dict(values), outputs=dict(outputs), command_id=command_id
        )
        self._secrets_serial += 1
        self._unacked_secrets[key] = (self._secrets_serial, self.executor.outbox.next_seq - 1, msg)
        self._kick.set()  # the writer sends it once the events before it are out

    def _command(self, command: wire.pb.Command) -> None:
        kind = command.WhichOneof("kind")
        log.info("command received", command=kind, id=command.id)
        if kind == "rerun":
            self.executor.rerun(list(command.rerun.steps))
        elif kind == "reboot":
            self._spawn(self._reboot(), "reboot")
        elif kind == "task":
            self._spawn(self._run_task(command.id, wire.step_from_pb(command.task.step)), "task")
        else:
            log.warning("ignoring a command this agent does not know", command=kind)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self.supervisor.watch(coro, name, forever=False)  # a failure stops the agent

    async def _run_task(self, command_id: str, step: Step) -> None:
        self._tasks_running += 1
        self._no_task.clear()
        try:
            result = await self.executor.run_task(step)
        finally:
            self._tasks_running -= 1
            if not self._tasks_running:
                self._no_task.set()
        if result.ok:
            self._on_step_secrets(step.name, result.secrets, result.outputs, command_id)

    async def _reboot(self) -> None:
        await self._drain_outbox(10.0)  # so that the controller hears why the node went away
        proc = await asyncio.create_subprocess_exec(*self.config.reboot_command)
        if await proc.wait() != 0:
            raise RuntimeError(f"{' '.join(self.config.reboot_command)} exited with {proc.returncode}")
        await asyncio.sleep(3600)  # the node is going down; nothing more to do

    def _maybe_renew(self, identity: Identity) -> None:
        """Ask for a new certificate once a third of its lifetime is left (checked every heartbeat)."""
        cert = read_certinfo(identity.cert_pem)
        now = dt.datetime.now(dt.timezone.utc)
        if not self._streaming or not self._renewal.due(cert, now):
            return
        csr = make_csr(identity.key_pem, identity.node_name)
        self._send(wire.pb.AgentMessage(renew=wire.pb.RenewRequest(csr_pem=csr)))
        self._renewal.asked(cert, now)
        log.info("certificate renewal requested", expires=cert.not_valid_after.isoformat())

    # -- periodic -----------------------------------------------------------------------------

    async def _health_loop(self) -> None:
        await asyncio.sleep(1.0)
        while True:
            self._health_now.clear()  # before the report: a stream coming up meanwhile asks again
            if self._streaming:
                try:
                    health = await asyncio.to_thread(facts.collect_health, self.state_dir)
                    self._send(wire.pb.AgentMessage(health=wire.health_to_pb(health)))
                except Exception as exc:  # a probe must never take the agent down
                    log.warning("health probe failed", error=str(exc))
                if self.identity is not None:
                    self._maybe_renew(self.identity)  # a stream can outlive two thirds of a certificate
            self._write_metrics()
            with contextlib.suppress(asyncio.TimeoutError):  # a heartbeat's time: the next report
                await asyncio.wait_for(self._health_now.wait(), self.heartbeat)

    def _write_metrics(self) -> None:
        """The metrics textfile, when configured (a failure is logged by the writer, once)."""
        if self.textfile is None:
            return
        from tether.nodeagent import textfile

        if self._streaming:
            self.last_connected = time.time()
        plan, identity = self.executor.plan, self.identity
        try:
            steps = textfile.step_counts(plan, self.executor.journal)
            pending = self.executor.outbox.count()
        except sqlite3.Error as exc:
            log.warning("metrics textfile not written", error=str(exc))
            return
        self.textfile.write(
            textfile.AgentFigures(
                version=__version__,
                environment=identity.environment if identity else "",
                role=identity.role if identity else "",
                steps=steps,
                outbox_pending=pending,
                connected=self._streaming,
                last_connected=self.last_connected,
                plan_generation=plan.generation if plan else 0,
            )
        )

    async def _watchdog_loop(self) -> None:
        interval = systemd.watchdog_interval() or 10.0
        while True:
            systemd.notify("WATCHDOG=1")
            await asyncio.sleep(interval)


def state_summary(state_dir: Path) -> dict[str, object]:
    """What ``tether-agent status`` prints: identity, journal and outbox, read from disk."""
    store = IdentityStore(state_dir)
    if not (state_dir / DB_NAME).exists():
        raise AgentError(f"no agent state in {state_dir} (has the agent run here?)")
    db = StateDB(state_dir / DB_NAME, readonly=True)
    try:
        executor_plan = db.get_meta("plan")
        from tether.nodeagent.executor import plan_from_json
        from tether.nodeagent.journal import Journal
        from tether.nodeagent.outbox import Outbox

        plan = plan_from_json(executor_plan) if executor_plan else None
        journal = {e.digest: e for e in Journal(db).entries()}
        outbox = Outbox(db)
        summary: dict[str, object] = {
            "enrolled": store.exists(),
            "node": store.load().node_name if store.exists() else "",
            "controllers": list(store.controllers()),  # the replicas it tries, in order
            "plan_generation": plan.generation if plan else 0,
            "steps": [
                {"name": s.name, "state": journal[s.digest].state.value if s.digest in journal else "pending"}
                for s in (plan.steps if plan else ())
            ],
            "outbox_pending": outbox.count(),
            "next_seq": outbox.next_seq,
            "acked_seq": outbox.acked_seq,
        }
        return summary
    except sqlite3.Error as exc:  # a damaged page that opening did not read
        raise state_error(db.path, exc) from exc
    finally:
        db.close()


__all__ = ["Agent", "AgentError", "AgentState", "Backoff", "state_summary"]
