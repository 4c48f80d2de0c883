"""AgentService: enrollment and the per-node stream (thin; the logic lives in its parts).

Revocation and the presented certificate are checked when the stream opens, again at attach
(after hello, with no await in between, so ``node revoke`` either sees the session or the
attach sees the revocation), and before every hand-out: a plan, a renewal, accepting events,
gates and step secrets (the orchestrator checks again before it releases anything).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import fields, is_dataclass, replace
from typing import Any

import grpc

from tether.controller import enrollment, metrics, wire
from tether.controller.agentbundles import AgentBundles, HeldBundle
from tether.controller.app import App
from tether.controller.auth import Kind
from tether.controller.enrollment import csr_key_hash, same
from tether.controller.errors import (
    AlreadyExists,
    ControllerError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    TokenRejected,
    Unauthenticated,
)
from tether.controller.hub import Session
from tether.controller.limits import PLAN_CACHE_ENTRIES
from tether.controller.quotas import NodeQuotas
from tether.controller.refusals import REFUSALS
from tether.controller.resets import Resets
from tether.controller.rpc import stream, unary
from tether.controller.store.records import NodeRecord
from tether.nodeagent import logs
from tether.nodeagent.model import Event, Health, HostFacts, Plan, facts_from_dict, now_ms
from tether.nodeagent.secrets import LineRedactor, Redactor

log = logs.get_logger("tether.controller.agents")
HEALTH_PERSIST_SECONDS = 60.0  # a stream's health report goes to the store at most this often
HEALTH_FLUSH_SECONDS = 2.0  # the reports due are written together, this long after the first of them
REDACT_SLICE_BYTES = 8 * 1024  # output masked between two turns of the event loop
HELLO_TIMEOUT_SECONDS = 30.0
MAX_SEQ = 2**62  # an acked boundary beyond this is nonsense (SQLite integers are 63-bit)


def plain(value: Any) -> Any:
    """``dataclasses.asdict`` for our frozen records, without its deep copies (same JSON).

    Each type is looked at once (a health report is 21 calls: 17 µs with an ``is_dataclass``
    per value; scalars now return at once)."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    names = _FIELDS.get(kind, _UNSEEN)
    if names is _UNSEEN:
        dataclass_ = is_dataclass(value) and not isinstance(value, type)
        names = _FIELDS[kind] = tuple(f.name for f in fields(value)) if dataclass_ else None
    if names is not None:
        return {name: plain(getattr(value, name)) for name in names}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


_SCALARS = frozenset({str, int, float, bool, type(None)})
_UNSEEN: Any = object()
_FIELDS: dict[type, tuple[str, ...] | None] = {}


class AgentService(wire.AgentServiceServicer):
    def __init__(self, app: App) -> None:
        self.app = app
        self.quotas = NodeQuotas(app.config.node_output_bytes_per_second)
        self.resets = Resets(app)  # node delete / reset (the admin service uses it too)
        self._plan_messages: dict[tuple[str, str, int, str], wire.agent.ControllerMessage] = {}
        self.health = HealthSaver(app)

    # -- Enroll -------------------------------------------------------------------------------

    @unary
    async def Enroll(self, request: wire.agent.EnrollRequest, context: Any) -> wire.agent.EnrollResponse:
        app = self.app
        app.auth.principal(context)  # any verified identity, usually the anonymous one
        started_ms = now_ms()
        ask: enrollment.EnrollAsk | None = None
        try:
            ask = enrollment.parse(request)
            # Cheap read-only check first, so refused tokens never cost a signature.
            token, existing = app.store.get_token(ask.token_id), app.store.get_node(ask.node_name)
            enrollment.check(app.store, ask, token, existing)
            if enrollment.is_retry(ask, token, existing) and not self.quotas.renewal(ask.node_name):
                # The same key again is a new certificate: as rare as a renewal.
                raise ResourceExhausted("this node asked for certificates too often; try again later", 600.0)
            days = app.config.node_cert_days
            issued = app.ca.sign_node_csr(ask.csr.csr, ask.node_name, days, public_key=ask.csr.public_key)
            moved = enrollment.elsewhere(token, existing)
            if moved is not None:  # another environment's revoked node: forgotten, as node delete does
                await self.resets.forget(moved)
            asked = ask
            node = await app.store.enroll_node(
                ask.token_id, ask.node_name, lambda t, e: enrollment.decide(app.store, asked, issued, t, e)
            )
        except (TokenRejected, AlreadyExists) as exc:
            metrics.count_enrollment(exc)
            REFUSALS.refused(
                "enrollment refused",
                node=ask.node_name if ask else request.node_name[:64],
                token_id=ask.token_id if ask else "",
                reason=getattr(exc, "reason", "enrolled"),
            )
            raise
        except Exception as exc:
            metrics.count_enrollment(exc)
            raise
        if node.key_hash == ask.key_hash and node.enrolled_ms >= started_ms:
            await app.cluster.forget_node(node.environment, ask.node_name)  # a fresh machine under this name
        next_seq = max(node.stored_seq, app.store.max_seq(ask.node_name)) + 1
        metrics.count_enrollment(None)
        log.info(
            "node enrolled",
            node=ask.node_name,
            environment=node.environment,
            role=node.role,
            token_id=ask.token_id,
        )
        return wire.agent.EnrollResponse(
            certificate_pem=issued.cert_pem,
            ca_pem=app.ca.cert_pem,
            node_name=ask.node_name,
            environment=node.environment,
            role=node.role,
            next_seq=next_seq,
        )

    # -- Connect ------------------------------------------------------------------------------

    def admitted(self, name: str, presented: str) -> NodeRecord:
        """The node's current record if it may be served now: not revoked, and ``presented`` (the
        fingerprint of its certificate) is its current one or the previous one."""
        node = self.app.store.get_node(name)
        if node is None or node.revoked:
            raise PermissionDenied(f"node {name!r} is revoked or unknown")
        if not (same(presented, node.cert_fingerprint) or same(presented, node.prev_fingerprint)):
            raise Unauthenticated(f"the certificate of node {name!r} has been superseded")
        return node

    async def admitted_now(self, name: str, presented: str) -> NodeRecord:
        """``admitted``, asking the database again before a refusal: with several replicas the node
        may have enrolled or renewed through another one a moment ago (its notice still on the way)."""
        try:
            return self.admitted(name, presented)
        except (PermissionDenied, Unauthenticated):
            if self.app.store.kind == "sqlite":
                raise
        await self.app.store.refresh_node(name)
        return self.admitted(name, presented)

    async def _opening(self, context: Any) -> tuple[str, str]:
        """(node name, presented fingerprint) of a stream that may open, or a ControllerError."""
        principal = self.app.auth.principal(context)
        if principal.kind is not Kind.NODE:
            raise PermissionDenied("Connect needs a node certificate (enroll first)")
        wait = self.quotas.connect(principal.name)
        if wait:
            REFUSALS.refused("stream refused: opened too often", node=principal.name)
            raise ResourceExhausted(
                f"node {principal.name!r} opens its stream too often; retry in {math.ceil(wait)}s",
                retry_after_s=math.ceil(wait),
            )
        await self.admitted_now(principal.name, principal.fingerprint)
        return principal.name, principal.fingerprint

    async def Connect(  # type: ignore[override]  # writes with context.write instead of yielding
        self, request_iterator: AsyncIterator[wire.agent.AgentMessage], context: Any
    ) -> None:
        app = self.app
        try:
            name, presented = await self._opening(context)
        except ControllerError as exc:
            await _abort(context, exc)
            return
        # Messages are read with ``context.read``, not ``request_iterator``: gRPC's iterator keeps
        # the last message it yielded (parsed, with its arena: 1-7 KiB) until the next one arrives.
        try:
            first = await asyncio.wait_for(context.read(), HELLO_TIMEOUT_SECONDS)
        except asyncio.TimeoutError:
            return
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("kind") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be hello")
            return
        try:
            node = self.admitted(name, presented)  # again: it may have been revoked while we waited
        except ControllerError as exc:
            REFUSALS.refused("stream refused at attach", node=name, reason=str(exc))
            await _abort(context, exc)
            return
        session = app.hub.attach(node.name, node.environment)  # no await since the check
        with logs.bound(node=node.name):
            try:
                node = await self._open(node, session, first.hello, context, presented)
                del first  # the hello (its message and arena, about 1 KiB) is not kept for the stream's life
                await self._stream(node, session, context, presented)
            except ControllerError as exc:
                await _abort(context, exc)
            finally:
                app.hub.detach(session)
                last = self.health.take(session)  # a report not written yet goes with the close
                with contextlib.suppress(Exception):
                    await app.store.update_node(node.name, last_seen_ms=now_ms(), **last)
                log.info("stream closed")

    # -- FetchAgentBundle -----------------------------------------------------------------------

    @stream
    async def FetchAgentBundle(
        self, request: wire.agent.FetchAgentBundleRequest, context: Any
    ) -> AsyncIterator[wire.agent.BundleChunk]:
        """The bundle of the version the node's plan names, from ``offset``, in chunks of at most
        ``AGENT_BUNDLE_CHUNK_BYTES``; the first carries the whole bundle's size and SHA-256.

        Only that version: bundles hold no secret, but a node reads what it was told to run and
        nothing else (a revoked or superseded certificate is refused like on ``Connect``)."""
        principal = self.app.auth.principal(context)
        if principal.kind is not Kind.NODE:
            raise PermissionDenied("FetchAgentBundle needs a node certificate (enroll first)")
        node = await self.admitted_now(principal.name, principal.fingerprint)
        bundles, held = self._bundle_for(node, request.version)
        if request.offset > held.size:
            raise InvalidArgument(f"offset {request.offset} is past the end ({held.size} bytes)")
        chunks = bundles.chunks(held, request.offset)
        first = True
        try:
            while (item := await asyncio.to_thread(next, chunks, None)) is not None:
                offset, data = item
                yield wire.agent.BundleChunk(
                    data=data, offset=offset, size=held.size, sha256=held.sha256 if first else ""
                )
                first = False
        finally:
            chunks.close()  # the file, also when the node went away in the middle
        if first:  # asked from the end: the size and digest still say what the whole is
            yield wire.agent.BundleChunk(offset=held.size, size=held.size, sha256=held.sha256)

    def _bundle_for(self, node: NodeRecord, version: str) -> tuple[AgentBundles, HeldBundle]:
        bundles = self.app.bundles
        env = self.app.planner.revision(node.environment, node.plan_generation)
        named = env.agent_version if env is not None else ""
        if not version or version != named:
            REFUSALS.refused("agent bundle refused: not the version of the node's plan", node=node.name)
            raise PermissionDenied(f"the plan of node {node.name!r} names no agent version {version!r}")
        held = bundles.held(version) if bundles is not None else None
        if bundles is None or held is None:
            raise NotFound(f"this controller holds no agent bundle of version {version!r}")
        return bundles, held

    async def _greet(self, node: NodeRecord, hello: wire.agent.Hello, presented: str) -> NodeRecord:
        """Record the hello; retire the previous certificate once the current one is presented;
        take the agent's acked boundary when this store is behind it (restored from a backup)."""
        app = self.app
        facts = wire.facts_from_pb(hello.facts)
        await app.store.update_node(
            node.name,
            facts=plain(facts),
            agent_version=hello.agent_version,
            agent_rolled_back_from=hello.rolled_back_from,
            last_seen_ms=now_ms(),
        )
        if hello.upgraded_from or hello.rolled_back_from:
            log.info(
                "agent upgraded" if hello.upgraded_from else "agent rolled back",
                agent_version=hello.agent_version,
                upgraded_from=hello.upgraded_from or None,
                rolled_back_from=hello.rolled_back_from or None,
            )
        if node.prev_fingerprint and same(presented, node.cert_fingerprint):
            await app.store.update_node(node.name, prev_fingerprint="")
            node = replace(node, prev_fingerprint="")
            log.info("the previous certificate is retired: the renewed one is in use")
        acked = min(hello.last_acked_seq, MAX_SEQ)
        if acked > node.stored_seq:
            stored = await app.store.accept_acked(node.name, acked)
            log.warning(
                "the agent had events acknowledged that this store lacks (restored from a backup?); "
                "recorded the gap and accepted its boundary",
                missing_from=node.stored_seq + 1,
                missing_to=acked,
            )
            node = replace(node, stored_seq=stored)
        return node

    async def _open(
        self, node: NodeRecord, session: Session, hello: wire.agent.Hello, context: Any, presented: str
    ) -> NodeRecord:
        """Record the hello, send Welcome and Settings, and the plan when the agent lacks it."""
        app = self.app
        node = await self._greet(node, hello, presented)
        session.stored_seq = node.stored_seq
        app.progress.seen(node.name, node.environment, app.store.node_steps(node.name))  # what runs now
        context.set_compression(grpc.Compression.Gzip)  # for plans alone (``_send``); before the first write
        await _send(
            context,
            wire.agent.ControllerMessage(
                welcome=wire.agent.Welcome(
                    node_name=node.name,
                    stored_seq=node.stored_seq,
                    # the live replicas (this one first) the agent fails over to; none with SQLite
                    controllers=app.replicas.welcome_controllers() if app.replicas is not None else [],
                )
            ),
        )
        await _send(
            context,
            wire.agent.ControllerMessage(
                settings=wire.agent.Settings(heartbeat_seconds=app.config.heartbeat_seconds)
            ),
        )
        log.info(
            "stream open",
            agent_version=hello.agent_version,
            stored_seq=node.stored_seq,
            agent_next_seq=hello.next_seq,
        )
        await self.deliver_plan(
            node,
            wire.facts_from_pb(hello.facts),
            agent_digest=hello.plan_digest,
            agent_generation=hello.plan_generation,
        )
        await app.cluster.on_connect(node)
        # The stream keeps its node's record for its whole life: without the facts and health it
        # was read with (as they were before this hello; parsed JSON, 1-3 KiB), which nothing
        # downstream reads from it (they read the store's, or the session's health).
        return replace(node, facts={}, health={})

    async def _stream(
        self,
        node: NodeRecord,
        session: Session,
        context: Any,
        presented: str,
    ) -> None:
        """The agent's messages are read here, on gRPC's own task for the call, and one writer task
        sends the session's outbox: one task of ours per stream (it was three, and an
        ``asyncio.wait`` over them). Whichever ends first ends the stream: the agent closing its
        side, an error (raised here), the writer, or the session closed (revoked, replaced,
        reset: ``session.close`` interrupts the read)."""
        stop = _Interrupt()
        writer = asyncio.create_task(self._write(session, context, stop))
        session.on_close = stop.fire
        try:
            if session.closed.is_set():  # closed while the stream opened
                return
            with stop:
                await self._read(node, session, context.read, presented)
            if writer.done() and not writer.cancelled() and writer.exception() is not None:
                raise writer.exception()  # type: ignore[misc]
        finally:
            session.on_close = None
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writer

    @staticmethod
    async def _write(session: Session, context: Any, stop: _Interrupt) -> None:
        """Send the session's outbox until the session is closed; the stream ends with the writer."""
        outbox = session.outbox
        try:
            while not outbox.is_set():
                for msg in await outbox.drain():
                    if outbox.is_set():  # revoked or replaced: nothing queued meanwhile goes out
                        return
                    await _send(context, msg)
                msg = None  # not kept while the stream idles
        finally:
            stop.fire()

    async def deliver_plan(
        self,
        node: NodeRecord,
        facts: HostFacts,
        *,
        agent_digest: str = "",
        agent_generation: int = -1,
        generation: int | None = None,
    ) -> None:
        """Render the node's plan; record it and send it when the agent does not have it."""
        app = self.app
        current = app.store.get_node(node.name)
        if current is None or current.revoked:
            return  # a revoked node gets no plan (its stream is being closed)
        plan = await self.render_plan(current, facts, generation)
        current = app.store.get_node(node.name)
        if current is None or current.revoked:
            return
        if plan.digest != current.plan_digest or plan.generation != current.plan_generation:
            await app.store.set_node_plan(node.name, plan)
            if app.hardware is not None:  # a quarantine of a step this plan no longer has goes
                await app.hardware.on_plan(current, plan)
        if plan.digest != agent_digest or plan.generation != agent_generation:
            app.hub.send(node.name, self.plan_message(plan))

    async def render_plan(self, node: NodeRecord, facts: HostFacts, generation: int | None = None) -> Plan:
        """The plan ``node`` should have now: the reset plan while it is reset, else its
        environment's at ``generation`` (None: the one the rollouts let it have)."""
        app = self.app
        plan = self.resets.plan_for(node)  # a node being reset gets the reset plan
        if plan is None:
            cluster = await app.cluster.context(node)
            if generation is None:
                generation = app.rollouts.generation_for(node)  # a rollout may hold it back
            plan = app.planner.plan(node.environment, node.role, facts, cluster, generation)
        return plan

    async def push_plan(self, name: str, generation: int | None = None) -> None:
        """Hand ``name`` the plan it should have now (a rollout admitted it); stored when offline.
        ``generation``: the one another replica chose for it (None: this one's rollouts decide)."""
        node = self.app.store.get_node(name)
        if node is not None and not node.revoked:
            await self.deliver_plan(
                node,
                facts_from_dict(node.facts),
                agent_digest=node.plan_digest,
                agent_generation=node.plan_generation,
                generation=generation,
            )

    def plan_message(self, plan: Plan) -> wire.agent.ControllerMessage:
        """The plan as a message, converted once per plan (a fleet of alike nodes shares it)."""
        key = (plan.environment, plan.role, plan.generation, plan.digest)
        msg = self._plan_messages.get(key)
        if msg is None:
            msg = wire.agent.ControllerMessage(plan=wire.plan_to_pb(plan))
            self._plan_messages[key] = msg
            while len(self._plan_messages) > PLAN_CACHE_ENTRIES:
                del self._plan_messages[next(iter(self._plan_messages))]
        return msg

    async def _read(
        self,
        node: NodeRecord,
        session: Session,
        read: Callable[[], Awaitable[Any]],
        presented: str = "",
    ) -> None:
        """Handle the agent's messages until ``read`` says the stream ended (``grpc.aio.EOF``)."""
        while (msg := await read()) is not grpc.aio.EOF:
            session.last_seen = time.monotonic()
            kind = msg.WhichOneof("kind")
            if kind == "health":
                # Kept as its bytes (about 200): the parsed message would hold its whole arena.
                session.report_health(msg.health.SerializeToString(), _health_from_bytes)
                drift = self.app.drift
                if drift is not None:  # GPU conditions (compared in memory; written on change)
                    await drift.on_health(node.name, node.environment, session, msg.health)
                saved = session.health_saved
                if not saved or session.last_seen - saved >= HEALTH_PERSIST_SECONDS:
                    self.health.due(session)
            elif kind in ("events", "gate", "secrets", "renew"):
                self.admitted(node.name, presented)  # revoked meanwhile: the stream ends here
                await self._handle(node, session, msg, kind, presented)
            elif kind == "hello":
                log.warning("duplicate hello ignored")
            else:
                log.warning("ignoring a message kind this controller does not know", kind=kind)
            del msg  # not kept while the stream waits for the next (an event batch: about 6 KiB)

    async def _handle(
        self, node: NodeRecord, session: Session, msg: wire.agent.AgentMessage, kind: str, presented: str
    ) -> None:
        """The messages that store something or may hand something out (the node was just checked)."""
        app = self.app
        if kind == "events":
            await self._events(node, session, msg.events.events)
        elif kind == "gate":
            gate = msg.gate
            if app.hardware is None:
                await app.gates.gate_requested(node, gate.step, gate.digest, gate.attempt or 1)
            else:  # the hardware gate answers with the facts the node sent, then hands on
                facts = wire.facts_from_pb(gate.facts) if gate.HasField("facts") else None
                await app.hardware.gate_requested(
                    node, gate.step, gate.digest, gate.attempt or 1, facts=facts
                )
        elif kind == "secrets":
            s = msg.secrets
            # The gate keeper decides what is accepted; it masks what it keeps.
            if await app.gates.secrets_received(node, s.step, dict(s.values), s.command_id, dict(s.outputs)):
                session.send(
                    wire.agent.ControllerMessage(ack=wire.agent.Ack(seq=0, secrets=[s.command_id or s.step]))
                )
        elif kind == "renew":
            await self._renew(node, session, msg.renew.csr_pem, presented)

    async def _events(self, node: NodeRecord, session: Session, raw: Any) -> None:
        """Store a batch: over-quota output summarised first (never redacted, never stored), then
        the rest redacted; acknowledge the contiguous mark and pass the batch on.

        A node over its quota is also read more slowly: the pause holds its stream back through
        HTTP/2 flow control, so a flood costs the controller little and the other nodes nothing.
        """
        app = self.app
        # Events sent again (a lost ack, a reconnect) are stored already: never charged twice.
        charged = self.quotas.apply(
            node.name, [wire.event_from_pb(m) for m in raw if m.seq > session.stored_seq]
        )
        events = charged.events
        if charged.summarised:
            REFUSALS.refused(
                "output over the node's quota summarised, not stored",
                node=node.name,
                events=charged.summarised,
            )
        for i, e in enumerate(events):
            if e.lines or e.message or e.observed:
                events[i] = await _redacted(e, app.redactor)
        stored = await app.store.append_events(node.name, events) if events else session.stored_seq
        metrics.events_stored(node.environment, events)
        session.stored_seq = max(session.stored_seq, stored)
        session.send(wire.agent.ControllerMessage(ack=wire.agent.Ack(seq=stored)))
        # A generator: the copies are made only when someone follows this node's events.
        app.hub.publish(node.name, node.environment, (replace(e, node=node.name) for e in events))
        app.progress.observe(node.name, node.environment, events)  # step durations: ETAs, stragglers
        await app.cluster.on_events(node, events)
        await self.resets.on_events(node, events)  # a reset reported done: the node is forgotten
        if app.hardware is not None:
            await app.hardware.on_events(node, events)  # failed GPU diagnostics quarantine
        app.rollouts.poke(node.environment)
        if charged.over_bytes or charged.over_events:
            await asyncio.sleep(self.quotas.pause(charged))

    async def _renew(self, node: NodeRecord, session: Session, csr_pem: bytes, presented: str) -> None:
        """Sign a new certificate for the node's own key. The certificate it presented stays valid
        (as the previous one) until the new one is presented, so a lost reply never locks it out."""
        app = self.app
        current = app.store.get_node(node.name)
        if current is None or current.revoked:
            return
        if not same(csr_key_hash(csr_pem), current.key_hash):
            REFUSALS.refused("certificate renewal refused: the CSR has a different key", node=node.name)
            return
        if not self.quotas.renewal(node.name):
            REFUSALS.refused("certificate renewal refused: over the node's renewal rate", node=node.name)
            return
        issued = app.ca.sign_node_csr(csr_pem, node.name, app.config.node_cert_days)
        await app.store.update_node(
            node.name,
            cert_fingerprint=issued.fingerprint,
            prev_fingerprint=presented or current.cert_fingerprint,
        )
        session.send(
            wire.agent.ControllerMessage(certificate=wire.agent.Certificate(certificate_pem=issued.cert_pem))
        )
        log.info("certificate renewed")


def _health_from_bytes(report: bytes) -> Health:
    return wire.health_from_pb(wire.common.Health.FromString(report))


class HealthSaver:
    """Health reports to the store: each stream's first, then at most one every
    ``HEALTH_PERSIST_SECONDS``. What they are for: ``node describe`` and ``node list`` of a node
    whose stream is not open here (offline, or held by another replica) and what a restart
    finds; a node connected here is shown its latest report, from its session. Each write
    carries the node's ``last_seen_ms`` (when its stream was last heard from).

    The reports due are written together, ``HEALTH_FLUSH_SECONDS`` after the first of them, so
    they share the store's group commits: one at a time, each with its own commit, a save cost
    about 300 µs of CPU (with 10,000 agents, 167 a second: 5 % of a core); together, about
    65 µs (``scripts/stream_memory.py ops``). A stream that closes first takes its report with
    it (``take``: written with the close). Reports due when the controller stops are not
    written; the agent reports again to whichever controller it reaches next."""

    def __init__(self, app: App) -> None:
        self.app = app
        self._due: dict[str, Session] = {}
        self._flush: asyncio.Task[None] | None = None

    def due(self, session: Session) -> None:
        """``session``'s latest report is to be written (at the next flush: the latest then)."""
        session.health_saved = session.last_seen
        self._due[session.node] = session
        if self._flush is None:
            self._flush = asyncio.create_task(self._later())

    def take(self, session: Session) -> dict[str, Any]:
        """The fields to write with the close of ``session``'s stream: its report, if one is due."""
        if self._due.get(session.node) is not session:
            return {}
        del self._due[session.node]
        health = session.health
        return {"health": plain(health)} if health is not None else {}

    async def flush(self) -> None:
        """Write every report due now, together."""
        due, self._due = self._due, {}
        now, mono = now_ms(), time.monotonic()
        writes = []
        for name, session in due.items():
            health = session.health
            if health is not None:
                seen_ms = now - int((mono - session.last_seen) * 1000)
                writes.append(self.app.store.update_node(name, health=plain(health), last_seen_ms=seen_ms))
        failed = [r for r in await asyncio.gather(*writes, return_exceptions=True) if r is not None]
        if failed:
            log.warning("health reports not saved", nodes=len(failed), error=str(failed[0]))

    async def _later(self) -> None:
        try:
            await asyncio.sleep(HEALTH_FLUSH_SECONDS)
        finally:
            self._flush = None
        await self.flush()


class _Interrupt:
    """Ends the wait of the task inside ``with`` from a callback, as ``asyncio.timeout`` does:
    the task is cancelled (from the loop, never from within itself) and the cancellation it
    caused is swallowed on the way out, with whatever the cancelled wait raised instead; a
    cancellation from anyone else goes on. ``fire`` outside the ``with`` does nothing."""

    __slots__ = ("_cancelled", "_fired", "_task")

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = None
        self._fired = self._cancelled = False

    def __enter__(self) -> _Interrupt:
        self._task = asyncio.current_task()
        return self

    def fire(self) -> None:
        if self._task is not None and not self._fired:
            self._fired = True
            asyncio.get_running_loop().call_soon(self._cancel)

    def _cancel(self) -> None:
        if self._task is not None:  # still inside: suspended in a wait, since this is a callback
            self._cancelled = True
            self._task.cancel()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        task, self._task = self._task, None
        if not self._cancelled:
            return False
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+: cancellations are counted
        others = uncancel() if uncancel is not None else 0
        if exc_type is asyncio.CancelledError:
            return others == 0  # ours alone: swallowed
        return exc_type is not None and issubclass(exc_type, Exception)  # what the wait raised instead


async def _send(context: Any, msg: wire.agent.ControllerMessage) -> None:
    """Write ``msg`` on the stream, compressed (gzip) when it is a plan, never otherwise.

    A plan carries every step rendered with the step library: 35 KB for the bench's three
    custom steps, about 5 KB compressed (0.3-0.8 ms of CPU, once per plan a node does not have
    yet: not at a reconnect). Written whole, a message that size leaves gRPC's buffers for the
    connection larger for good: with 2,000 agents, 118 KiB per connected agent against 105
    (``scripts/stream_memory.py memory``). Small messages (acks, notices) would only grow.
    """
    if not msg.HasField("plan"):
        context.disable_next_message_compression()
    await context.write(msg)


async def _abort(context: Any, exc: ControllerError) -> None:
    """End the call with ``exc``'s status; a rate refusal carries its retry hint as metadata too."""
    metadata: tuple[tuple[str, str], ...] = ()
    if isinstance(exc, ResourceExhausted) and exc.retry_after_s:
        metadata = (("retry-after-seconds", str(math.ceil(exc.retry_after_s))),)
    await context.abort(exc.code, str(exc), trailing_metadata=metadata)


async def _redacted(e: Event, redactor: Redactor) -> Event:
    """``e`` with every known secret masked, a secret split across two of its lines included.

    Most output holds nothing to mask (one cheap look at all of it says so). Otherwise masking
    costs about 0.1 ms per KiB: the loop gets a turn every ``REDACT_SLICE_BYTES``, so a node
    sending large batches never holds up the other nodes' streams for long.
    """
    lines = e.lines
    if not redactor.holds_nothing("\n".join(lines)):
        per_line = LineRedactor(redactor)
        masked: list[str] = []
        budget = REDACT_SLICE_BYTES
        for line in lines:
            masked.append(per_line.redact(line)[0])
            budget -= len(line)
            if budget <= 0:
                await asyncio.sleep(0)
                budget = REDACT_SLICE_BYTES
        lines = tuple(masked)
    return replace(
        e,
        lines=lines,
        message=redactor.redact(e.message),
        observed={k: redactor.redact(v) for k, v in e.observed.items()},
    )
