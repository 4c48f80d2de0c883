"""The controller's side of the wire: the only controller module that imports ``*_pb2``.

Admin-specific conversions live here; the shared ones (plans, events, facts,
health) come from ``tether.nodeagent.wire``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tether.controller import tokens
from tether.controller.cluster.health import Report
from tether.controller.store.records import EnvironmentRecord, NodeRecord, StepRecord
from tether.controller.tokens import TokenRecord
from tether.nodeagent.model import Health, HostFacts
from tether.nodeagent.wire import (
    event_from_pb,
    event_to_pb,
    facts_from_pb,
    facts_to_pb,
    health_from_pb,
    health_to_pb,
    plan_from_pb,
    plan_to_pb,
    step_from_pb,
    step_to_pb,
)
from tether.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, agent_pb2_grpc, common_pb2

# Shared conversions, re-exported so the controller has one wire module.
__all__ = [
    "event_from_pb",
    "event_to_pb",
    "facts_from_pb",
    "facts_to_pb",
    "health_from_pb",
    "health_to_pb",
    "plan_from_pb",
    "plan_to_pb",
    "step_from_pb",
    "step_to_pb",
]

admin = admin_pb2
agent = agent_pb2
common = common_pb2
AdminServiceServicer = admin_pb2_grpc.AdminServiceServicer
AgentServiceServicer = agent_pb2_grpc.AgentServiceServicer
AdminServiceStub = admin_pb2_grpc.AdminServiceStub
add_admin = admin_pb2_grpc.add_AdminServiceServicer_to_server
add_agent = agent_pb2_grpc.add_AgentServiceServicer_to_server
SERVICE_NAMES = (
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
    agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
)
AGENT_SERVICE = agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name
AGENT_METHODS = tuple(m.name for m in agent_pb2.DESCRIPTOR.services_by_name["AgentService"].methods)


def environment_to_pb(
    env: EnvironmentRecord, node_count: int = 0, notes: Sequence[str] = ()
) -> admin_pb2.Environment:
    return admin_pb2.Environment(
        name=env.name,
        generation=env.generation,
        document=env.document,
        api_version=env.api_version,
        created_ms=env.created_ms,
        updated_ms=env.updated_ms,
        node_count=node_count,
        notes=list(notes),
        agent_version=env.agent_version,
    )


def token_to_pb(t: TokenRecord) -> admin_pb2.Token:
    return admin_pb2.Token(
        id=t.id,
        environment=t.environment,
        role=t.role,
        node_name=t.node_name,
        expires_ms=t.expires_ms,
        uses=t.uses,
        max_uses=t.max_uses,
        revoked=t.revoked,
        created_ms=t.created_ms,
        description=t.description,
        status=tokens.status(t),
    )


def step_status_to_pb(s: StepRecord, requested: Mapping[str, str] | None = None) -> admin_pb2.StepStatus:
    return admin_pb2.StepStatus(
        name=s.name,
        digest=s.digest,
        state=s.state,
        exit_code=s.exit_code,
        updated_ms=s.updated_ms,
        component=s.component,
        requested=dict(requested or {}),
        observed=dict(s.observed),
        attempt=s.attempt,
        message=s.message,
    )


def node_to_pb(
    node: NodeRecord,
    state: str,
    connected: bool,
    *,
    steps: Sequence[admin_pb2.StepStatus] = (),
    health: Health | None = None,
    facts: HostFacts | None = None,
    eta_ms: int = 0,
    straggler: bool = False,
) -> admin_pb2.Node:
    msg = admin_pb2.Node(
        name=node.name,
        environment=node.environment,
        role=node.role,
        state=state,
        connected=connected,
        last_seen_ms=node.last_seen_ms,
        enrolled_ms=node.enrolled_ms,
        plan_generation=node.plan_generation,
        plan_digest=node.plan_digest,
        steps=list(steps),
        agent_version=node.agent_version,
        stored_seq=node.stored_seq,
        cert_fingerprint=node.cert_fingerprint,
        agent_rolled_back_from=node.agent_rolled_back_from,
        conditions=node_conditions_to_pb(node.hardware),
        eta_ms=eta_ms,
        straggler=straggler,
    )
    quarantine = node.hardware.get("quarantine")
    if quarantine:
        msg.quarantine.CopyFrom(quarantine_to_pb(quarantine))
    if facts is not None:
        msg.facts.CopyFrom(facts_to_pb(facts))
    if health is not None:
        msg.health.CopyFrom(health_to_pb(health))
    return msg


def quarantine_to_pb(q: Mapping[str, Any]) -> admin_pb2.Quarantine:
    """``NodeRecord.hardware["quarantine"]`` (``tether.controller.hardware``) as a message."""
    return admin_pb2.Quarantine(
        stage=str(q.get("stage", "")),
        problems=[str(p) for p in q.get("problems", ())],
        expected={str(k): str(v) for k, v in q.get("expected", {}).items()},
        found={str(k): str(v) for k, v in q.get("found", {}).items()},
        since_ms=int(q.get("since_ms", 0)),
    )


def node_conditions_to_pb(hardware: Mapping[str, Any]) -> list[admin_pb2.NodeCondition]:
    """The hardware conditions that hold (``NodeRecord.hardware["conditions"]``: type -> {reason,
    message, since_ms}), by type."""
    conditions = hardware.get("conditions", {})
    return [
        admin_pb2.NodeCondition(
            type=str(kind),
            reason=str(c.get("reason", "")),
            message=str(c.get("message", "")),
            since_ms=int(c.get("since_ms", 0)),
        )
        for kind, c in sorted(conditions.items())
    ]


def cluster_health_to_pb(report: Report) -> admin_pb2.ClusterHealth:
    return admin_pb2.ClusterHealth(
        environment=report.environment,
        available=report.available,
        api_server=report.api_server,
        endpoint=report.endpoint,
        init_node=report.init_node,
        desired_control_planes=report.desired_control_planes,
        desired_workers=report.desired_workers,
        conditions=[
            admin_pb2.Condition(type=c.type, status=c.status, reason=c.reason, message=c.message)
            for c in report.conditions
        ],
        nodes=[
            admin_pb2.ClusterNodeHealth(
                name=n.name,
                role=n.role,
                ready=n.ready,
                version=n.version,
                internal_ip=n.internal_ip,
                agent_state=n.agent_state,
                kubelet=n.kubelet,
                runtime=n.runtime,
                joined=n.joined,
                conditions=[
                    admin_pb2.NodeCondition(
                        type=c.type, reason=c.reason, message=c.message, since_ms=c.since_ms
                    )
                    for c in n.conditions
                ],
            )
            for n in report.nodes
        ],
    )
