"""The admin API's rollout calls, apart from the servicer: diff a document, show a rollout."""

from __future__ import annotations

from tether.controller import wire
from tether.controller.app import App
from tether.controller.planner import stable_facts
from tether.controller.render import NodeContext, render
from tether.controller.rollout.diff import step_changes
from tether.controller.rollout.state import NodeStage, Rollout
from tether.controller.spec import LoadedSpec
from tether.nodeagent.model import Plan, facts_from_dict


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


def rollout_to_pb(r: Rollout) -> wire.admin.Rollout:
    p = r.policy
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
            )
            for name, n in sorted(r.nodes.items())
        ],
        reason=r.reason,
        started_ms=r.started_ms,
        updated_ms=r.updated_ms,
        agent_version=r.agent_version,
    )
