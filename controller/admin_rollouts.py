"""The admin API's rollout calls, apart from the servicer: diff a document, show a rollout."""

from __future__ import annotations

from collections.abc import Mapping

from tether.controller import wire
from tether.controller.app import App
from tether.controller.nodestate import NodeState, node_state
from tether.controller.planner import stable_facts
from tether.controller.progress import NO_ESTIMATE, Estimate, is_done, rollout_eta
from tether.controller.render import NodeContext, render
from tether.controller.rollout.diff import step_changes
from tether.controller.rollout.state import NodeStage, Rollout, RolloutStatus
from tether.controller.spec import LoadedSpec
from tether.controller.spec.parse_rollout import resolve_count
from tether.controller.store.records import NodeRecord, StepRecord
from tether.nodeagent.model import Plan, facts_from_dict, now_ms

MEASURED_UPDATED_NODES = 3  # with no node running: updated nodes read to tell what a node takes


def diff(app: App, loaded: LoadedSpec, document: str) -> wire.admin.DiffEnvironmentResponse:
    """Per enrolled node, what applying ``document`` would add, change or remove (nodes alike
    share one rendering, as the planner's cache does)."""
    name = loaded.spec.name
    current = app.store.get_environment(name)
    rendered: dict[NodeContext, Plan] = {}
    nodes = []
    for node in app.store.list_nodes(name):
        if node.revoked:
            continue
        ctx = NodeContext(node.role, stable_facts(facts_from_dict(node.facts)), app.cluster.peek(node))
        plan = rendered.get(ctx)
        if plan is None:
            plan = rendered[ctx] = Plan.build(
                render(loaded.spec, ctx).steps, environment=name, role=node.role
            )
        changes = step_changes([(s.name, s.digest) for s in app.store.node_steps(node.name)], plan)
        nodes.append(
            wire.admin.NodeDiff(
                name=node.name, steps=[wire.admin.StepChange(name=c.name, change=c.change) for c in changes]
            )
        )
    return wire.admin.DiffEnvironmentResponse(
        environment=name,
        nodes=nodes,
        changed=current is None or any(n.steps for n in nodes),
        generation=current.generation if current else 0,
        notes=list(loaded.notes),
    )


def rollout_to_pb(
    r: Rollout, estimates: Mapping[str, Estimate] | None = None, eta_ms: int = 0
) -> wire.admin.Rollout:
    """``r`` as a message; ``estimates`` (running nodes) and ``eta_ms`` from ``estimate``."""
    p = r.policy
    estimates = estimates or {}
    return wire.admin.Rollout(
        environment=r.environment,
        state=r.status.value,
        generation=r.generation,
        from_generation=r.from_generation,
        policy=wire.admin.RolloutPolicy(
            max_parallel=p.max_parallel,
            max_failures=p.max_failures,
            canary=p.canary,
            min_healthy_seconds=p.min_healthy_seconds,
            drain=p.drain,
        ),
        updated=r.count(NodeStage.UPDATED),
        running=r.count(NodeStage.RUNNING),
        pending=r.count(NodeStage.PENDING),
        failed=r.count(NodeStage.FAILED),
        nodes=[
            wire.admin.RolloutNode(
                name=name,
                state=n.stage.value,
                step=n.step,
                message=n.message,
                updated_ms=n.since_ms,
                control_plane=n.control_plane,
                eta_ms=estimates.get(name, NO_ESTIMATE).eta_ms,
                straggler=estimates.get(name, NO_ESTIMATE).straggler,
            )
            for name, n in sorted(r.nodes.items())
        ],
        reason=r.reason,
        started_ms=r.started_ms,
        updated_ms=r.updated_ms,
        agent_version=r.agent_version,
        eta_ms=eta_ms,
    )


def status(app: App, r: Rollout) -> wire.admin.Rollout:
    """``r`` with the ETA of each running node and of the whole rollout (``tether.controller.progress``)."""
    return rollout_to_pb(r, *estimate(app, r, now_ms()))


def estimate(app: App, r: Rollout, now: int) -> tuple[dict[str, Estimate], int]:
    """(running node -> its estimate, the rollout's ETA or 0). Reads the steps of the running
    nodes (and, when none runs, of a few updated ones), nothing more."""
    if r.status is not RolloutStatus.PROGRESSING:
        return {}, 0
    estimates: dict[str, Estimate] = {}
    workers: list[int] = []
    plane: int | None = None
    works: list[int | None] = []  # what a node of this rollout takes, per node measured (None: unknown)
    for name in r.names(NodeStage.RUNNING):
        node = app.store.get_node(name)
        steps = app.store.node_steps(name) if node is not None else []
        if node is not None and node.plan_generation == r.generation:
            works.append(_work_ms(app, node.environment, steps, r.started_ms))
        finish, node_estimate = _running_finish(app, r, name, node, steps, now)
        if node_estimate is not None:
            estimates[name] = node_estimate
        if finish is None:
            continue  # the next look counts it failed: it holds no slot
        if r.nodes[name].control_plane:
            plane = finish
        else:
            workers.append(finish)
    pending = r.names(NodeStage.PENDING)
    if pending and not works:
        works = _updated_work_ms(app, r)
    if pending and r.policy.canary and not r.canary_done:
        return estimates, 0  # a canary pause comes first: an operator resumes it
    known = [w for w in works if w is not None]
    planes = sum(1 for n in pending if r.nodes[n].control_plane)
    eta = rollout_eta(
        now,
        running=workers,
        plane_running=plane,
        pending_workers=len(pending) - planes,
        pending_planes=planes,
        work_ms=max(known) if known and len(known) == len(works) else None,
        slots=resolve_count(r.policy.max_parallel, len(r.nodes), default=len(r.nodes), at_least_one=True),
        healthy_ms=r.policy.min_healthy_seconds * 1000,
    )
    return estimates, eta


def _running_finish(
    app: App, r: Rollout, name: str, node: NodeRecord | None, steps: list[StepRecord], now: int
) -> tuple[int | None, Estimate | None]:
    """When running node ``name`` frees its batch slot (its ETA plus ``minHealthySeconds``; 0:
    cannot tell; None: it holds none, being failed or quarantined, which the rollout counts
    failed), and its estimate while it provisions."""
    if node is None or node.plan_generation != r.generation:
        return 0, None  # not handed this generation's plan yet
    healthy_ms = r.policy.min_healthy_seconds * 1000
    state = node_state(node, steps, app.hub.connected(name))
    if state is NodeState.PROVISIONING:
        got = app.progress.estimate(name, node.environment, steps, now)
        return (got.eta_ms + healthy_ms if got.eta_ms else 0), got
    if state is NodeState.PROVISIONED:
        return max(now, (r.nodes[name].healthy_since_ms or now) + healthy_ms), None
    if state in (NodeState.FAILED, NodeState.QUARANTINED):
        return None, None
    return 0, None  # offline: cannot tell


def _updated_work_ms(app: App, r: Rollout) -> list[int | None]:
    """What a node of this rollout takes, measured on a few nodes it updated (none running)."""
    works: list[int | None] = []
    changed = [n for n in r.names(NodeStage.UPDATED) if not r.nodes[n].unchanged]
    for name in changed[:MEASURED_UPDATED_NODES]:
        node = app.store.get_node(name)
        if node is not None:
            works.append(_work_ms(app, node.environment, app.store.node_steps(name), r.started_ms))
    return works


def _work_ms(app: App, environment: str, steps: list[StepRecord], since_ms: int) -> int | None:
    """What a node of this rollout takes: the medians of the steps it ran since the rollout began
    or has left (None: one of them without history)."""
    total = 0.0
    for s in steps:
        if s.state == "skipped" or (is_done(s) and s.updated_ms < since_ms):
            continue  # not run in this rollout (unchanged)
        m = app.progress.median(environment, s.name, s.digest)
        if m is None:
            return None
        total += m
    return round(total * 1000)
