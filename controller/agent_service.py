"""AgentService: enrollment and the per-node stream (thin; the logic lives in its parts)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, fields, is_dataclass, replace
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from controller import tokens, wire
from controller.app import App
from controller.auth import Kind
from controller.errors import (
    AlreadyExists,
    InvalidArgument,
    PermissionDenied,
    TokenRejected,
    Unauthenticated,
)
from controller.hub import Session
from controller.rpc import unary
from controller.store.records import NodeRecord
from controller.tokens import TokenRecord
from nodeagent import logs
from nodeagent.identity import CONTROLLER_SERVER_NAME
from nodeagent.model import HostFacts, Plan, now_ms
from nodeagent.secrets import Secret

log = logs.get_logger("tether.controller.agents")
NODE_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
# Names a node certificate must never carry (they name the controller in TLS).
RESERVED_NAMES = frozenset({CONTROLLER_SERVER_NAME, "localhost"})
HEALTH_PERSIST_SECONDS = 60.0


def plain(value: Any) -> Any:
    """``dataclasses.asdict`` for our frozen records, without its deep copies (same JSON)."""
    names = _FIELDS.get(type(value))
    if names is None and is_dataclass(value) and not isinstance(value, type):
        names = _FIELDS[type(value)] = tuple(f.name for f in fields(value))
    if names is not None:
        return {name: plain(getattr(value, name)) for name in names}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


_FIELDS: dict[type, tuple[str, ...]] = {}
PLAN_MESSAGE_CACHE = 256


def csr_key_hash(csr_pem: bytes) -> str:
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as exc:
        raise InvalidArgument(f"invalid CSR: {exc}") from None
    der = csr.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


class AgentService(wire.AgentServiceServicer):
    def __init__(self, app: App) -> None:
        self.app = app
        self._plan_messages: dict[tuple[str, str, int, str], wire.agent.ControllerMessage] = {}

    # -- Enroll -------------------------------------------------------------------------------

    @unary
    async def Enroll(self, request: wire.agent.EnrollRequest, context: Any) -> wire.agent.EnrollResponse:
        app = self.app
        app.auth.principal(context)  # any verified identity, usually the anonymous one
        token = Secret(request.token)
        node_name = request.node_name.strip().lower()
        if not NODE_NAME_RE.match(node_name):
            raise InvalidArgument(
                f"invalid node name {request.node_name!r}: use lowercase letters, digits, '-' and '.'"
            )
        if node_name in RESERVED_NAMES:
            raise InvalidArgument(f"the node name {node_name!r} is reserved")
        try:
            token_id, secret_part = tokens.parse(token)
        except TokenRejected as exc:
            log.warning("enrollment refused", node=node_name, reason=exc.reason)
            raise
        key_hash = csr_key_hash(request.csr_pem)
        facts = wire.facts_from_pb(request.facts)
        started_ms = now_ms()

        def is_retry(token_rec: TokenRecord | None, existing: NodeRecord | None) -> bool:
            # The same key asking again with the token it enrolled with (the reply was lost).
            return (
                token_rec is not None
                and existing is not None
                and not existing.revoked
                and existing.key_hash == key_hash
                and existing.token_id == token_rec.id
                and tokens.hash_secret(secret_part) == token_rec.secret_hash
            )

        def check(token_rec: TokenRecord | None, existing: NodeRecord | None) -> None:
            if is_retry(token_rec, existing):
                return
            tokens.check(
                token_rec,
                secret_part,
                now_ms=now_ms(),
                node_name=node_name,
                expect_environment=request.expect_environment,
                expect_role=request.expect_role,
            )
            assert token_rec is not None
            if app.store.get_environment(token_rec.environment) is None:
                raise TokenRejected(
                    "scope",
                    f"join token {token_rec.id} is scoped to environment "
                    f"{token_rec.environment!r}, which no longer exists",
                )
            if existing is not None and not existing.revoked:
                raise AlreadyExists(
                    f"node {node_name!r} is already enrolled; revoke it first "
                    f"(tetherctl node revoke {node_name}) to enroll a re-imaged machine"
                )

        try:
            # Cheap read-only check first, so refused tokens never cost a signature.
            check(app.store.get_token(token_id), app.store.get_node(node_name))
            issued = app.ca.sign_node_csr(request.csr_pem, node_name, app.config.node_cert_days)

            def decide(token_rec: TokenRecord | None, existing: NodeRecord | None) -> tuple[NodeRecord, bool]:
                check(token_rec, existing)  # again, atomically with the use count
                assert token_rec is not None
                if is_retry(token_rec, existing):
                    assert existing is not None
                    return replace(
                        existing,
                        cert_fingerprint=issued.fingerprint,
                        prev_fingerprint=existing.cert_fingerprint,
                    ), False
                return NodeRecord(
                    name=node_name,
                    environment=token_rec.environment,
                    role=token_rec.role,
                    cert_fingerprint=issued.fingerprint,
                    key_hash=key_hash,
                    token_id=token_rec.id,
                    enrolled_ms=now_ms(),
                    facts=asdict(facts),
                    stored_seq=existing.stored_seq if existing else 0,
                ), True

            node = await app.store.enroll_node(token_id, node_name, decide)
        except TokenRejected as exc:
            log.warning("enrollment refused", node=node_name, token_id=token_id, reason=exc.reason)
            raise
        if node.key_hash == key_hash and node.enrolled_ms >= started_ms:
            await app.cluster.forget_node(node.environment, node_name)  # a fresh machine under this name
        next_seq = max(node.stored_seq, app.store.max_seq(node_name)) + 1
        log.info(
            "node enrolled", node=node_name, environment=node.environment, role=node.role, token_id=token_id
        )
        return wire.agent.EnrollResponse(
            certificate_pem=issued.cert_pem,
            ca_pem=app.ca.cert_pem,
            node_name=node_name,
            environment=node.environment,
            role=node.role,
            next_seq=next_seq,
        )

    # -- Connect ------------------------------------------------------------------------------

    async def Connect(  # type: ignore[override]  # writes with context.write instead of yielding
        self, request_iterator: AsyncIterator[wire.agent.AgentMessage], context: Any
    ) -> None:
        app = self.app
        try:
            principal = app.auth.principal(context)
            if principal.kind is not Kind.NODE:
                raise PermissionDenied("Connect needs a node certificate (enroll first)")
            node = app.store.get_node(principal.name)
            if node is None or node.revoked:
                raise PermissionDenied(f"node {principal.name!r} is revoked or unknown")
            if principal.fingerprint not in (node.cert_fingerprint, node.prev_fingerprint):
                raise Unauthenticated(f"the certificate of node {node.name!r} has been superseded")
        except (PermissionDenied, Unauthenticated) as exc:
            await context.abort(exc.code, str(exc))
            return
        it = request_iterator.__aiter__()
        try:
            first = await asyncio.wait_for(it.__anext__(), 30)
        except (StopAsyncIteration, asyncio.TimeoutError):
            return
        if first.WhichOneof("kind") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be hello")
            return
        session = app.hub.attach(node.name, node.environment)
        with logs.bound(node=node.name):
            try:
                await self._serve(node, session, first.hello, it, context, presented=principal.fingerprint)
            finally:
                app.hub.detach(session)
                with contextlib.suppress(Exception):
                    await app.store.update_node(node.name, last_seen_ms=now_ms())
                log.info("stream closed")

    async def _serve(
        self,
        node: NodeRecord,
        session: Session,
        hello: wire.agent.Hello,
        it: AsyncIterator[wire.agent.AgentMessage],
        context: Any,
        presented: str = "",
    ) -> None:
        app = self.app
        facts = wire.facts_from_pb(hello.facts)
        await app.store.update_node(
            node.name, facts=plain(facts), agent_version=hello.agent_version, last_seen_ms=now_ms()
        )
        await context.write(
            wire.agent.ControllerMessage(
                welcome=wire.agent.Welcome(node_name=node.name, stored_seq=node.stored_seq)
            )
        )
        await context.write(
            wire.agent.ControllerMessage(
                settings=wire.agent.Settings(heartbeat_seconds=app.config.heartbeat_seconds)
            )
        )
        log.info(
            "stream open",
            agent_version=hello.agent_version,
            stored_seq=node.stored_seq,
            agent_next_seq=hello.next_seq,
        )
        await self.deliver_plan(
            node, facts, agent_digest=hello.plan_digest, agent_generation=hello.plan_generation
        )
        await app.cluster.on_connect(node)
        # Three tasks for the life of the stream (not one wait per outgoing message): whichever
        # ends first ends the stream; an error in the reader or the writer is raised here.
        reader = asyncio.create_task(self._read(node, session, it, presented))
        writer = asyncio.create_task(self._write(session, context))
        closed = asyncio.create_task(session.closed.wait())
        try:
            done, _ = await asyncio.wait({reader, writer, closed}, return_when=asyncio.FIRST_COMPLETED)
            for task in (reader, writer):
                if task in done and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            closed.cancel()
            for task in (reader, writer):
                task.cancel()
            for task in (reader, writer):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    @staticmethod
    async def _write(session: Session, context: Any) -> None:
        outbox = session.outbox
        while True:
            await context.write(await outbox.get())

    async def deliver_plan(
        self, node: NodeRecord, facts: HostFacts, *, agent_digest: str = "", agent_generation: int = -1
    ) -> None:
        """Render the node's plan; record it and send it when the agent does not have it."""
        app = self.app
        cluster = await app.cluster.context(node)
        plan = app.planner.plan(node.environment, node.role, facts, cluster)
        current = app.store.get_node(node.name) or node
        if plan.digest != current.plan_digest or plan.generation != current.plan_generation:
            await app.store.set_node_plan(node.name, plan)
        if plan.digest != agent_digest or plan.generation != agent_generation:
            app.hub.send(node.name, self._plan_message(plan))

    def _plan_message(self, plan: Plan) -> wire.agent.ControllerMessage:
        """The plan as a message, converted once per plan (a fleet of alike nodes shares it)."""
        key = (plan.environment, plan.role, plan.generation, plan.digest)
        msg = self._plan_messages.get(key)
        if msg is None:
            msg = wire.agent.ControllerMessage(plan=wire.plan_to_pb(plan))
            self._plan_messages[key] = msg
            while len(self._plan_messages) > PLAN_MESSAGE_CACHE:
                del self._plan_messages[next(iter(self._plan_messages))]
        return msg

    async def _read(
        self,
        node: NodeRecord,
        session: Session,
        it: AsyncIterator[wire.agent.AgentMessage],
        presented: str = "",
    ) -> None:
        app = self.app
        async for msg in it:
            session.last_seen = time.monotonic()
            kind = msg.WhichOneof("kind")
            if kind == "events":
                await self._events(node, session, msg.events.events)
            elif kind == "health":
                session.report_health(msg.health, wire.health_from_pb)
                saved = session.health_saved
                if not saved or session.last_seen - saved >= HEALTH_PERSIST_SECONDS:
                    await self._save_health(node, session)
            elif kind == "gate":
                await app.gates.gate_requested(node, msg.gate.step, msg.gate.digest, msg.gate.attempt or 1)
            elif kind == "secrets":
                s = msg.secrets
                # The gate keeper decides what is accepted; it masks what it keeps.
                if await app.gates.secrets_received(
                    node, s.step, dict(s.values), s.command_id, dict(s.outputs)
                ):
                    session.send(
                        wire.agent.ControllerMessage(
                            ack=wire.agent.Ack(seq=0, secrets=[s.command_id or s.step])
                        )
                    )
            elif kind == "renew":
                await self._renew(node, session, msg.renew.csr_pem, presented)
            elif kind == "hello":
                log.warning("duplicate hello ignored")
            else:
                log.warning("ignoring a message kind this controller does not know", kind=kind)

    async def _events(self, node: NodeRecord, session: Session, raw: Any) -> None:
        app = self.app
        redact = app.redactor.redact
        events = []
        for m in raw:
            e = wire.event_from_pb(m)
            if e.lines or e.message or e.observed:
                e = replace(
                    e,
                    lines=tuple(redact(line) for line in e.lines),
                    message=redact(e.message),
                    observed={k: redact(v) for k, v in e.observed.items()},
                )
            events.append(e)
        stored = await app.store.append_events(node.name, events)
        session.send(wire.agent.ControllerMessage(ack=wire.agent.Ack(seq=stored)))
        # A generator: the copies are made only when someone follows this node's events.
        app.hub.publish(node.name, node.environment, (replace(e, node=node.name) for e in events))
        await app.cluster.on_events(node, events)

    async def _save_health(self, node: NodeRecord, session: Session) -> None:
        """The first report of a stream, then one a minute, goes to the store."""
        session.health_saved = time.monotonic()
        health = session.health
        assert health is not None
        await self.app.store.update_node(node.name, health=plain(health), last_seen_ms=now_ms())

    async def _renew(self, node: NodeRecord, session: Session, csr_pem: bytes, presented: str) -> None:
        """Sign a new certificate for the node's own key. The certificate it presented stays valid
        (as the previous one) until the new one is seen, so a lost reply never locks it out."""
        app = self.app
        current = app.store.get_node(node.name)
        if current is None or current.revoked:
            return
        if csr_key_hash(csr_pem) != current.key_hash:
            log.warning("certificate renewal refused: the CSR has a different key")
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
