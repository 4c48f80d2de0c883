"""AdminService: what tetherctl and platform integrations call (thin; checks the caller first)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, TypeVar

from tether.controller import __version__, admin_rollouts, audit, enrollment, paging, tokens, wire
from tether.controller.agent_service import AgentService
from tether.controller.app import App
from tether.controller.audit import audited
from tether.controller.auth import Principal
from tether.controller.documents import DocumentParser
from tether.controller.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Problem,
    check_generation,
)
from tether.controller.limits import STREAM_RECHECK_SECONDS
from tether.controller.nodestate import NodeState, node_state
from tether.controller.progress import NO_ESTIMATE
from tether.controller.replicas import dnsnames
from tether.controller.rpc import stream, unary
from tether.controller.spec import names
from tether.controller.store.records import NodeRecord
from tether.nodeagent import logs
from tether.nodeagent.model import Event, HostFacts, Role, facts_from_dict, health_from_dict, now_ms

log = logs.get_logger("tether.controller.admin")
MAX_EVENTS = 10_000
T = TypeVar("T")


class AdminService(wire.AdminServiceServicer):
    def __init__(self, app: App, agents: AgentService) -> None:
        self.app = app
        self.agents = agents
        self.documents = DocumentParser(app.config.max_document_bytes)
        # Applies check that a new environment's DNS-safe name is free, then write: one at a time
        # in this process; replicas sharing the store each claim the name first (replicas.dnsnames).
        self._creating = asyncio.Lock()

    def _caller(self, context: Any, *, write: bool) -> Principal:
        principal = self.app.auth.principal(context)
        principal.require_admin(write=write)
        return principal

    # Scopes (docs/admin-api.md, "Scopes"): an environment outside the caller's is PERMISSION_DENIED
    # whether or not it exists; a node or token is looked up first (NOT_FOUND), then refused when
    # it belongs to an environment outside the scope. Each check names its target for the audit log.

    @staticmethod
    def _in_scope(who: Principal, environment: str) -> str:
        audit.note(environment=environment)
        who.require_environment(environment)
        return environment

    def _scoped_node(self, who: Principal, name: str) -> NodeRecord:
        audit.note(node=name)
        node = self.app.store.get_node(name)
        if node is None:
            raise NotFound(f"node {name!r} not found")
        audit.note(environment=node.environment)
        if not who.may_see(node.environment):
            raise PermissionDenied(
                f"admin {who.name!r} may not use node {name!r}: its environment is outside the admin's scope"
            )
        return node

    def _scoped_token(self, who: Principal, token_id: str) -> tokens.TokenRecord:
        """The token, looked up first (NOT_FOUND), then refused if of another environment: the
        message does not name it (docs/admin-api.md, "Scopes")."""
        held = self.app.store.get_token(token_id)
        if held is None:
            raise NotFound(f"token {token_id!r} not found")
        audit.note(environment=held.environment)
        if not who.may_see(held.environment):
            raise PermissionDenied(
                f"admin {who.name!r} may not use token {token_id!r}: "
                "its environment is outside the admin's scope"
            )
        return held

    @unary
    async def GetVersion(self, request: wire.admin.GetVersionRequest, context: Any) -> Any:
        self._caller(context, write=False)
        return wire.admin.VersionInfo(version=__version__, api_version="tether.v1")

    # -- environments -------------------------------------------------------------------------

    @unary
    @audited(generations=True, unless=lambda q: q.dry_run, describe=lambda q, r: _changed(r.changed))
    async def ApplyEnvironment(
        self, request: wire.admin.ApplyEnvironmentRequest, context: Any
    ) -> wire.admin.ApplyEnvironmentResponse:
        who = self._caller(context, write=not request.dry_run)
        loaded = await self.documents.parse(request.document)  # raises with every problem
        name = self._in_scope(who, loaded.spec.name)
        app = self.app
        if request.dry_run:
            existing = app.store.get_environment(name)
            check_generation(name, existing.generation if existing else None, request.expected_generation)
            if existing is None:
                _check_dns_name_free(app, name, who)
            return wire.admin.ApplyEnvironmentResponse(
                environment=wire.admin.Environment(
                    name=name,
                    api_version=loaded.api_version,
                    generation=existing.generation if existing else 0,
                    notes=list(loaded.notes),
                ),
                changed=existing is None or existing.document != request.document,
                notes=list(loaded.notes),
            )
        async with self._creating:  # a new name's check and its write, one apply at a time
            before = app.store.get_environment(name)
            if before is None:
                _check_dns_name_free(app, name, who)
                _dns_clash(name, await dnsnames.claim(app.store, name), who)
            try:
                record, changed = await app.store.put_environment(  # Aborted at a stale expected_generation
                    name,
                    request.document,
                    loaded.api_version,
                    loaded.normalized,
                    expected_generation=request.expected_generation,
                )
            except BaseException:
                if before is None:
                    await dnsnames.release(app.store, name)
                raise
        replaced = record.generation if not changed else record.generation - 1 if before else 0
        audit.note(generation_before=replaced, generation_after=record.generation)  # not a concurrent one's
        app.planner.remember(record, loaded)  # plans render without parsing it again
        log.info(
            "environment applied",
            environment=name,
            generation=record.generation,
            changed=changed,
            by=who.name,
        )
        if changed:
            await app.rollouts.start(record, before.generation if before else 0)
        nodes = app.store.list_nodes(name)
        return wire.admin.ApplyEnvironmentResponse(
            environment=wire.environment_to_pb(record, len(nodes), loaded.notes),
            changed=changed,
            notes=list(loaded.notes),
        )

    @unary
    async def GetEnvironment(
        self, request: wire.admin.GetEnvironmentRequest, context: Any
    ) -> wire.admin.Environment:
        self._in_scope(self._caller(context, write=False), request.name)
        env = self.app.store.get_environment(request.name)
        if env is None:
            raise NotFound(f"environment {request.name!r} not found")
        return wire.environment_to_pb(env, len(self.app.store.list_nodes(env.name)))

    @unary
    async def ListEnvironments(
        self, request: wire.admin.ListEnvironmentsRequest, context: Any
    ) -> wire.admin.ListEnvironmentsResponse:
        who = self._caller(context, write=False)
        store = self.app.store
        page = paging.PageRequest.parse("ListEnvironments", request.page_size, request.page_token)
        visible = (e for e in store.list_environments() if who.may_see(e.name))
        result = paging.take(
            paging.after(visible, page.after, key=lambda e: e.name),
            page,
            key=lambda e: e.name,
            encode=lambda e: wire.environment_to_pb(e, len(store.list_nodes(e.name))),
        )
        return wire.admin.ListEnvironmentsResponse(
            environments=result.items, next_page_token=result.next_page_token
        )

    @unary
    @audited(generations=True, describe=lambda q, r: "reset its nodes first" if q.reset else "deleted")
    async def DeleteEnvironment(
        self, request: wire.admin.DeleteEnvironmentRequest, context: Any
    ) -> wire.admin.DeleteEnvironmentResponse:
        who = self._caller(context, write=True)
        self._in_scope(who, request.name)
        store, resets = self.app.store, self.agents.resets
        env = store.get_environment(request.name)
        if env is None:
            raise NotFound(f"environment {request.name!r} not found")
        audit.note(generation_before=env.generation)
        nodes = store.list_nodes(request.name)
        live = [n for n in nodes if not n.revoked]
        if live and not (request.force or request.reset):
            names = ", ".join(n.name for n in live[:5])
            raise FailedPrecondition(
                f"environment {request.name!r} still has {len(live)} enrolled node(s) ({names}); "
                "use --force to revoke them, or --reset to reset them first"
            )
        log.info(
            "environment delete",
            environment=request.name,
            by=who.name,
            nodes=len(nodes),
            how="reset" if request.reset and live else "delete",
        )
        if request.reset and live:
            for node in live:
                await self._reset(node, who.name)
            for node in nodes:
                if node.revoked:
                    await resets.forget(node)  # a revoked agent runs nothing: there is nothing to reset
            await resets.delete_environment_after_resets(request.name)  # once its last node went
        else:
            for node in live:
                await resets.revoke(node)
            await resets.delete_environment(request.name)
        audit.note(generation_after=env.generation if request.reset and live else 0)  # reset: it goes later
        return wire.admin.DeleteEnvironmentResponse()

    # -- tokens -------------------------------------------------------------------------------

    @unary
    @audited(describe=lambda q, r: _token_detail(r.info))
    async def CreateToken(
        self, request: wire.admin.CreateTokenRequest, context: Any
    ) -> wire.admin.CreateTokenResponse:
        who = self._caller(context, write=True)
        self._in_scope(who, request.environment)
        audit.note(node=request.node_name)
        app = self.app
        if app.store.get_environment(request.environment) is None:
            raise NotFound(f"environment {request.environment!r} not found")
        enrollment.check_token_name(app.store, request.environment, request.node_name)
        try:
            role = Role.parse(request.role or "worker").value
        except ValueError as exc:
            raise InvalidArgument(str(exc), [Problem("role", str(exc))]) from None
        ttl = request.ttl_seconds or tokens.DEFAULT_TTL_SECONDS
        if ttl > tokens.MAX_TTL_SECONDS:
            too_long = f"ttl must be at most {tokens.MAX_TTL_SECONDS // 86400} days"
            raise InvalidArgument(too_long, [Problem("ttl_seconds", too_long)])
        uses = request.uses or tokens.DEFAULT_USES
        token_id, token = tokens.generate()
        secret_part = token.reveal().split(".", 1)[1]
        now = now_ms()
        record = tokens.TokenRecord(
            id=token_id,
            secret_hash=tokens.hash_secret(secret_part),
            environment=request.environment,
            role=role,
            node_name=request.node_name,
            expires_ms=now + ttl * 1000,
            max_uses=uses,
            uses=0,
            revoked=False,
            created_ms=now,
            description=request.description,
        )
        await app.store.put_token(record)
        log.info(
            "join token created",
            token_id=token_id,
            environment=record.environment,
            role=role,
            uses=uses,
            ttl_seconds=ttl,
            by=who.name,
        )
        return wire.admin.CreateTokenResponse(
            token=token.reveal(),
            info=wire.token_to_pb(record),
            ca_hash=app.ca.ca_hash,
            controller=app.advertise,
        )

    @unary
    async def ListTokens(
        self, request: wire.admin.ListTokensRequest, context: Any
    ) -> wire.admin.ListTokensResponse:
        who = self._caller(context, write=False)
        if request.environment:
            self._in_scope(who, request.environment)
        page = paging.PageRequest.parse(
            "ListTokens", request.page_size, request.page_token, environment=request.environment
        )

        def key(t: tokens.TokenRecord) -> str:  # oldest first, as created; the id breaks a tie
            return f"{t.created_ms:016d}.{t.id}"

        visible = [t for t in self.app.store.list_tokens(request.environment) if who.may_see(t.environment)]
        listed = sorted(visible, key=key)
        result = paging.take(paging.after(listed, page.after, key), page, key, wire.token_to_pb)
        return wire.admin.ListTokensResponse(tokens=result.items, next_page_token=result.next_page_token)

    @unary
    @audited(describe=lambda q, r: f"token {q.id} revoked")
    async def RevokeToken(
        self, request: wire.admin.RevokeTokenRequest, context: Any
    ) -> wire.admin.RevokeTokenResponse:
        who = self._caller(context, write=True)
        self._scoped_token(who, request.id)
        if not await self.app.store.revoke_token(request.id):
            raise NotFound(f"token {request.id!r} not found")
        log.info("join token revoked", token_id=request.id, by=who.name)
        return wire.admin.RevokeTokenResponse()

    # -- nodes --------------------------------------------------------------------------------

    def _node_pb(self, node: NodeRecord, *, detail: bool) -> wire.admin.Node:
        app = self.app
        steps = app.store.node_steps(node.name)
        session = app.hub.session(node.name)
        connected = session is not None or app.hub.connected(node.name)  # or on another replica
        state = node_state(node, steps, connected).value
        health = (
            session.health
            if session and session.health
            else (health_from_dict(node.health) if node.health else None)
        )
        facts = facts_from_dict(node.facts) if node.facts else HostFacts()
        step_pbs = []
        if detail:
            requested: dict[str, dict[str, str]] = {}
            if node.facts:
                with contextlib.suppress(Exception):
                    plan = app.planner.plan(
                        node.environment,
                        node.role,
                        facts,
                        app.cluster.peek(node),
                        app.rollouts.generation_for(node),
                    )
                    requested = {s.name: dict(s.requested) for s in plan.steps}
            step_pbs = [wire.step_status_to_pb(s, requested.get(s.name)) for s in steps]
        # Provisioning: its ETA and whether it straggles, from its steps and the fleet's history.
        estimate = (
            app.progress.estimate(node.name, node.environment, steps, now_ms())
            if state == NodeState.PROVISIONING.value
            else NO_ESTIMATE
        )
        return wire.node_to_pb(
            node,
            state,
            connected,
            steps=step_pbs,
            health=health if detail else None,
            facts=facts,
            eta_ms=estimate.eta_ms,
            straggler=estimate.straggler,
        )

    @unary
    async def ListNodes(
        self, request: wire.admin.ListNodesRequest, context: Any
    ) -> wire.admin.ListNodesResponse:
        who = self._caller(context, write=False)
        env = self._in_scope(who, request.environment) if request.environment else ""
        page = paging.PageRequest.parse("ListNodes", request.page_size, request.page_token, environment=env)

        def key(n: NodeRecord) -> str:
            return n.name

        def fetch(after: str, limit: int) -> list[NodeRecord]:
            return self.app.store.list_nodes_page(env, after, limit)

        nodes = paging.keyset(fetch, page.after, page.size + 1, key)  # read as far as the page goes
        visible = (n for n in nodes if who.may_see(n.environment))
        result = paging.take(visible, page, key, lambda n: self._node_pb(n, detail=False))
        return wire.admin.ListNodesResponse(nodes=result.items, next_page_token=result.next_page_token)

    @unary
    async def GetNode(self, request: wire.admin.GetNodeRequest, context: Any) -> wire.admin.Node:
        node = self._scoped_node(self._caller(context, write=False), request.name)
        if self.app.store.kind != "sqlite" and self.app.hub.session(node.name) is None:
            node = await self.app.store.refresh_node(node.name) or node  # health saved by another replica
        return self._node_pb(node, detail=True)

    @unary
    @audited(describe=lambda q, r: "revoked")
    async def RevokeNode(
        self, request: wire.admin.RevokeNodeRequest, context: Any
    ) -> wire.admin.RevokeNodeResponse:
        who = self._caller(context, write=True)
        node = self._scoped_node(who, request.name)
        await self.app.store.update_node(node.name, revoked=True)
        await self.app.cluster.node_revoked(node)
        session = self.app.hub.session(node.name)
        if session is not None:
            session.close()
        log.info("node revoked", node=node.name, by=who.name)
        return wire.admin.RevokeNodeResponse()

    @unary
    @audited(describe=lambda q, r: "deleted (revoked first)" if q.force else "deleted")
    async def DeleteNode(self, request: wire.admin.DeleteNodeRequest, context: Any) -> Any:
        who = self._caller(context, write=True)
        node = self._scoped_node(who, request.name)
        if not node.revoked and self.app.hub.connected(node.name) and not request.force:
            raise FailedPrecondition(
                f"node {node.name!r} is connected: --force revokes it first "
                f"(tetherctl node reset {node.name} takes it out cleanly instead)"
            )
        if not node.revoked:
            await self.agents.resets.revoke(node)  # its agent stops; it cannot come back under it
        await self.agents.resets.forget(node)
        log.info("node deleted", node=node.name, environment=node.environment, by=who.name)
        return wire.admin.DeleteNodeResponse()

    @unary
    @audited(describe=lambda q, r: "reset started")
    async def ResetNode(self, request: wire.admin.ResetNodeRequest, context: Any) -> Any:
        who = self._caller(context, write=True)
        node = self._scoped_node(who, request.name)
        if node.revoked:
            raise FailedPrecondition(
                f"node {node.name!r} is revoked: its agent runs nothing any more "
                f"(tetherctl node delete {node.name} forgets it)"
            )
        await self._reset(node, who.name)
        return wire.admin.ResetNodeResponse()

    async def _reset(self, node: NodeRecord, who: str) -> None:
        """Start (or, for a reset that failed, retry) the node's reset and hand it the plan."""
        app = self.app
        if not await self.agents.resets.start(node, who):
            failed = [s.name for s in app.store.node_steps(node.name) if s.state == "failed"]
            if failed and app.hub.connected(node.name):  # asked again: run what failed once more
                await app.store.reset_steps(node.name, failed)
                command = wire.agent.Command(id=f"rerun-{now_ms()}", rerun=wire.agent.Rerun(steps=failed))
                app.hub.send(node.name, wire.agent.ControllerMessage(command=command))
        await self.agents.push_plan(node.name)

    @unary
    @audited(describe=lambda q, r: f"steps: {', '.join(q.steps) or 'all'}")
    async def RerunSteps(
        self, request: wire.admin.RerunStepsRequest, context: Any
    ) -> wire.admin.RerunStepsResponse:
        who = self._caller(context, write=True)
        node = self._scoped_node(who, request.node)
        known = {s.name for s in self.app.store.node_steps(node.name)}
        unknown = [s for s in request.steps if s not in known]
        if unknown:
            no_steps = f"node {node.name!r} has no step(s) {', '.join(unknown)}"
            raise InvalidArgument(no_steps, [Problem("steps", no_steps)])
        if not self.app.hub.connected(node.name):
            raise FailedPrecondition(f"node {node.name!r} is not connected")
        await self.app.store.reset_steps(node.name, list(request.steps))
        self.app.hub.send(
            node.name,
            wire.agent.ControllerMessage(
                command=wire.agent.Command(
                    id=f"rerun-{now_ms()}", rerun=wire.agent.Rerun(steps=list(request.steps))
                )
            ),
        )
        log.info("rerun requested", node=node.name, steps=list(request.steps), by=who.name)
        return wire.admin.RerunStepsResponse()

    @unary
    @audited()
    async def ReleaseNode(
        self, request: wire.admin.ReleaseNodeRequest, context: Any
    ) -> wire.admin.ReleaseNodeResponse:
        who = self._caller(context, write=True)
        node = self._scoped_node(who, request.name)
        if self.app.hardware is None:
            raise FailedPrecondition(f"node {node.name!r} is not quarantined")
        await self.app.hardware.release(node, who.name)
        log.info("quarantined node released", node=node.name, by=who.name)
        return wire.admin.ReleaseNodeResponse()

    # -- events -------------------------------------------------------------------------------

    @unary
    async def ListEvents(
        self, request: wire.admin.ListEventsRequest, context: Any
    ) -> wire.admin.ListEventsResponse:
        self._scoped_node(self._caller(context, write=False), request.node)
        limit = min(request.limit or MAX_EVENTS, MAX_EVENTS)
        events = await self.app.store.list_events(request.node, request.after_seq, limit)
        return wire.admin.ListEventsResponse(
            events=[wire.event_to_pb(_named(e, request.node)) for e in events]
        )

    @stream
    async def FollowEvents(self, request: wire.admin.ListEventsRequest, context: Any) -> AsyncIterator[Any]:
        who = self._caller(context, write=False)
        app = self.app
        if request.node:
            self._scoped_node(who, request.node)
            nodes, key = [request.node], f"node:{request.node}"
        elif request.environment:
            self._in_scope(who, request.environment)
            nodes, key = (
                [n.name for n in app.store.list_nodes(request.environment)],
                f"env:{request.environment}",
            )
        else:
            raise InvalidArgument("FollowEvents needs a node or an environment")
        recheck = functools.partial(self._still_allowed, context, request.environment, request.node)
        async for e in _rechecked(self._follow(nodes, key, request), recheck):
            yield e

    async def _follow(
        self, nodes: list[str], key: str, request: wire.admin.ListEventsRequest
    ) -> AsyncGenerator[Any, None]:
        """FollowEvents once its caller is checked: the stored events, then the live ones."""
        app = self.app
        follower = app.hub.follow([key])
        try:
            last: dict[str, int] = {}
            for name in nodes:
                last[name] = request.after_seq if request.node else 0
                async for e in self._stored(name, last[name]):
                    last[name] = e.seq
                    yield wire.event_to_pb(e)
            while True:
                e = await follower.get()  # raises FellBehind once it is cut off
                seen = last.get(e.node, 0)
                if e.seq <= seen:
                    continue
                if e.seq > seen + 1:
                    # A gap (events stored before this call followed): the store has them all.
                    async for missed in self._stored(e.node, seen, until=e.seq):
                        yield wire.event_to_pb(missed)
                last[e.node] = e.seq
                yield wire.event_to_pb(e)
        finally:
            app.hub.unfollow(follower)

    async def _stored(self, node: str, after: int, until: int = 0) -> AsyncIterator[Event]:
        """A node's stored events after ``after`` (and before ``until``), page by page."""
        while True:
            page = await self.app.store.list_events(node, after, MAX_EVENTS)
            for e in page:
                if until and e.seq >= until:
                    return
                after = e.seq
                yield _named(e, node)
            if len(page) < MAX_EVENTS:
                return

    # -- plans --------------------------------------------------------------------------------

    @unary
    async def RenderPlan(self, request: wire.admin.RenderPlanRequest, context: Any) -> Any:
        who = self._caller(context, write=False)
        app = self.app
        if request.node:
            if request.cluster_position:
                raise InvalidArgument("cluster_position previews an environment; a node has its own")
            node = self._scoped_node(who, request.node)
            plan = app.planner.plan(
                node.environment, node.role, facts_from_dict(node.facts), app.cluster.peek(node)
            )
        else:
            env = app.store.get_environment(self._in_scope(who, request.environment))
            if env is None:
                raise NotFound(f"environment {request.environment!r} not found")
            try:
                role = Role.parse(request.role or "worker").value
                cluster = app.cluster.preview(env, request.cluster_position)
            except ValueError as exc:
                raise InvalidArgument(str(exc)) from None
            if cluster is not None:
                role = cluster.position.role
            plan = app.planner.plan(env.name, role, wire.facts_from_pb(request.facts), cluster)
        return wire.plan_to_pb(plan)

    # -- rollouts -----------------------------------------------------------------------------

    @unary
    async def DiffEnvironment(self, request: wire.admin.DiffEnvironmentRequest, context: Any) -> Any:
        who = self._caller(context, write=False)
        loaded = await self.documents.parse(request.document)
        self._in_scope(who, loaded.spec.name)
        return admin_rollouts.diff(self.app, loaded, request.document)

    @unary
    async def GetRollout(self, request: wire.admin.GetRolloutRequest, context: Any) -> Any:
        self._in_scope(self._caller(context, write=False), request.environment)
        return admin_rollouts.status(self.app, self.app.rollouts.existing(request.environment))

    @unary
    @audited(describe=lambda q, r: _rollout_detail(r))
    async def PauseRollout(self, request: wire.admin.RolloutRequest, context: Any) -> Any:
        who = self._caller(context, write=True)
        self._in_scope(who, request.environment)
        return admin_rollouts.rollout_to_pb(await self.app.rollouts.pause(request.environment, who.name))

    @unary
    @audited(describe=lambda q, r: _rollout_detail(r))
    async def ResumeRollout(self, request: wire.admin.RolloutRequest, context: Any) -> Any:
        who = self._caller(context, write=True)
        self._in_scope(who, request.environment)
        return admin_rollouts.rollout_to_pb(await self.app.rollouts.resume(request.environment, who.name))

    @unary
    @audited(describe=lambda q, r: _rollout_detail(r))
    async def AbortRollout(self, request: wire.admin.RolloutRequest, context: Any) -> Any:
        who = self._caller(context, write=True)
        self._in_scope(who, request.environment)
        return admin_rollouts.rollout_to_pb(await self.app.rollouts.abort(request.environment, who.name))

    @unary
    @audited(generations=True, describe=lambda q, r: _rollout_detail(r))
    async def UndoRollout(self, request: wire.admin.RolloutRequest, context: Any) -> Any:
        who = self._caller(context, write=True)
        self._in_scope(who, request.environment)
        app = self.app
        current = app.rollouts.existing(request.environment)
        prev = app.rollouts.previous(request.environment)
        # Undoing an agent upgrade from "whatever they run" goes back to what most nodes ran.
        agent = prev.agent_version or (current.from_agent_version if current.agent_version else "")
        if agent and agent != current.agent_version:
            await self._bundle(agent)
        record, _ = await app.store.put_environment(
            prev.name, prev.document, prev.api_version, prev.spec, agent_version=agent
        )
        log.info(
            "rollout undone",
            environment=record.name,
            generation=record.generation,
            document_of=prev.generation,
            by=who.name,
        )
        r = await app.rollouts.start(record, current.generation, policy=current.policy)
        return admin_rollouts.rollout_to_pb(r)

    @unary
    @audited(generations=True, describe=lambda q, r: f"agent version {q.version or __version__}")
    async def UpgradeAgents(self, request: wire.admin.UpgradeAgentsRequest, context: Any) -> Any:
        who = self._caller(context, write=True)
        self._in_scope(who, request.environment)
        app = self.app
        env = app.store.get_environment(request.environment)
        if env is None:
            raise NotFound(f"environment {request.environment!r} not found")
        version = request.version or __version__
        await self._bundle(version)
        record, changed = await app.store.put_environment(
            env.name, env.document, env.api_version, env.spec, agent_version=version
        )
        log.info(
            "agent upgrade", environment=env.name, version=version, generation=record.generation, by=who.name
        )
        if changed:
            return admin_rollouts.rollout_to_pb(await app.rollouts.start(record, env.generation))
        return admin_rollouts.rollout_to_pb(app.rollouts.existing(env.name))

    async def _bundle(self, version: str) -> None:
        """The bundle of ``version`` is at hand (the controller's own is built on first use)."""
        if self.app.bundles is None:
            raise FailedPrecondition("this controller hands out no agent bundles")
        try:
            await self.app.bundles.ensure(version)
        except NotFound:
            raise FailedPrecondition(
                f"this controller holds no agent bundle of version {version!r} "
                "(tetherctl agent bundles lists the ones it has; tether-controller agent-bundle add FILE)"
            ) from None

    @unary
    async def ListAgentBundles(self, request: wire.admin.ListAgentBundlesRequest, context: Any) -> Any:
        self._caller(context, write=False)
        bundles = self.app.bundles
        return wire.admin.ListAgentBundlesResponse(
            bundles=[
                wire.admin.AgentBundle(version=t.version, sha256=t.sha256, size=t.size)
                for t in (bundles.versions() if bundles else [])
            ]
        )

    # -- audit log ----------------------------------------------------------------------------

    @unary
    async def ListAuditRecords(self, request: wire.admin.ListAuditRecordsRequest, context: Any) -> Any:
        """Who changed what, newest first; a scoped admin sees its environments' records only."""
        return await audit.list_records(self.app, self._caller(context, write=False), request)

    @unary
    async def ListControllers(self, request: wire.admin.ListControllersRequest, context: Any) -> Any:
        """The controller replicas sharing this one's store (tether.controller.replicas)."""
        self._caller(context, write=False)
        replicas = self.app.replicas
        return replicas.list_pb() if replicas is not None else wire.admin.ListControllersResponse()

    # -- clusters -----------------------------------------------------------------------------

    def _cluster_env(self, who: Principal, name: str) -> str:
        if self.app.store.get_environment(self._in_scope(who, name)) is None:
            raise NotFound(f"environment {name!r} not found")
        return name

    @unary
    async def GetClusterHealth(self, request: wire.admin.GetClusterHealthRequest, context: Any) -> Any:
        who = self._caller(context, write=False)
        report = self.app.cluster.health(self._cluster_env(who, request.environment))
        return wire.cluster_health_to_pb(report)

    @unary
    @audited(describe=lambda q, r: "kubeconfig exported")
    async def GetKubeconfig(self, request: wire.admin.GetKubeconfigRequest, context: Any) -> Any:
        who = self._caller(context, write=True)  # it grants cluster-admin: admins only
        text = self.app.cluster.kubeconfig(self._cluster_env(who, request.environment), request.server)
        log.info("kubeconfig exported", environment=request.environment, by=who.name)
        return wire.admin.GetKubeconfigResponse(kubeconfig=text)

    @unary
    @audited(describe=lambda q, r: "join material expired")
    async def ExpireJoinMaterial(self, request: wire.admin.ExpireJoinMaterialRequest, context: Any) -> Any:
        who = self._caller(context, write=True)
        await self.app.cluster.forget_material(self._cluster_env(who, request.environment))
        log.info("join material expired by an operator", environment=request.environment, by=who.name)
        return wire.admin.ExpireJoinMaterialResponse()

    @stream
    @audited(describe=lambda q, last: f"{last.target}: {last.outcome or last.kind}" if last else "")
    async def Bootstrap(self, request: wire.admin.BootstrapRequest, context: Any) -> AsyncIterator[Any]:
        """Adopt a machine over SSH or SSM; the request's credentials live for this call only."""
        who = self._caller(context, write=True)  # its environment's scope: bootstrap_service.run
        from tether.controller import bootstrap_service  # the bootstrap pulls asyncssh/boto3: only when used

        async for event in bootstrap_service.run(self.app, request, who):
            yield event

    # -- watches ------------------------------------------------------------------------------

    @stream
    async def WatchNodes(self, request: wire.admin.WatchNodesRequest, context: Any) -> AsyncIterator[Any]:
        """The node list, then every state change (or those after a revision): tether.controller.nodewatch."""
        principal = self.app.auth.principal(context)
        principal.require_admin(write=False)
        if request.environment:
            principal.require_environment(request.environment)
        if self.app.watch is None:
            raise FailedPrecondition("this controller keeps no node watch")
        node_pb = lambda record: self._node_pb(record, detail=False)  # noqa: E731
        changes = self.app.watch.events(
            request.environment, request.revision, principal.environments, node_pb
        )
        recheck = functools.partial(self._still_allowed, context, request.environment, "")
        async for event in _rechecked(changes, recheck):
            yield event

    def _still_allowed(self, context: Any, environment: str, node: str) -> None:
        """An open stream's caller, checked again (WatchNodes, FollowEvents): a revoked certificate
        is UNAUTHENTICATED, a scope the registry no longer records for it PERMISSION_DENIED, and so
        is a followed node that has moved to an environment outside the scope."""
        who = self._caller(context, write=False)
        if environment:
            who.require_environment(environment)
        record = self.app.store.get_node(node) if node and who.scoped else None
        if record is not None and not who.may_see(record.environment):
            raise PermissionDenied(f"admin {who.name!r} may no longer follow node {node!r}")


async def _rechecked(source: AsyncIterator[T], check: Callable[[], None]) -> AsyncIterator[T]:
    """``source``'s items, ``check`` (it raises to end the call) run before each one and at least
    every STREAM_RECHECK_SECONDS while none comes. ``source`` runs in a task of its own, which
    is kept across the waits (an item is never lost) and cancelled when the call ends."""
    pending: asyncio.Future[T] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(source))
            done, _ = await asyncio.wait({pending}, timeout=STREAM_RECHECK_SECONDS)
            check()
            if not done:
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            await asyncio.wait({pending})
            if not pending.cancelled():
                pending.exception()  # retrieved: an end the check came before is not logged as lost
        if isinstance(source, AsyncGenerator):
            await source.aclose()


def _named(e: Event, node: str) -> Event:
    return e if e.node else Event(**{**e.__dict__, "node": node})


# -- audit details (never a secret: ids, counts and states only) ---------------------------------


def _check_dns_name_free(app: App, name: str, who: Principal) -> None:
    """A new environment's DNS-safe name (``spec.names.dns_name``) is no other environment's:
    ``a_b`` and ``a-b`` would be the same cluster name, kubeconfig cluster and context. The other
    environment is named only to a caller who may see it; to a scoped admin outside it, it is
    "another environment" (its name is not the caller's to learn).

    Checked before the store's write, under ``AdminService._creating`` with it, so two concurrent
    applies in this process cannot both pass; replicas sharing a store also claim the name in the
    store first (``replicas.dnsnames``: of two at once, one wins)."""
    dns = names.dns_name(name)
    clash = next(
        (e.name for e in app.store.list_environments() if e.name != name and names.dns_name(e.name) == dns),
        "",
    )
    _dns_clash(name, clash, who)


def _dns_clash(name: str, clash: str, who: Principal) -> None:
    """AlreadyExists when environment ``clash`` ("": none) has ``name``'s DNS name."""
    if clash:
        dns = names.dns_name(name)
        other = f"environment {clash!r}" if who.may_see(clash) else "another environment"
        raise AlreadyExists(
            f"environment {name!r} would have the DNS name {dns!r}, which {other} already "
            "has (the names differ only where a DNS name cannot): rename one of them"
        )


def _changed(changed: bool) -> str:
    return "applied" if changed else "applied, nothing changed"


def _token_detail(t: Any) -> str:
    only = f", only node {t.node_name}" if t.node_name else ""
    return f"token {t.id}: role {t.role}, {t.max_uses} use(s){only}"


def _rollout_detail(r: Any) -> str:
    return f"rollout of generation {r.generation} (from {r.from_generation}): {r.state}"


__all__ = ["AdminService"]
