"""Cluster conditions (Progressing / Degraded / Available) from what the agents report.

Pure: it takes the nodes tether knows, the freshest cluster view a control
plane's agent reported (``kubectl get nodes`` through its admin.conf) and the
spec's desired counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tether.nodeagent.model import ClusterView, Role


@dataclass(frozen=True)
class NodeCondition:
    """A hardware condition that holds on a node (``tether.controller.hardware.drift``)."""

    type: str  # GPUsMissing | GPUErrors | DriverMismatch
    reason: str
    message: str
    since_ms: int = 0


@dataclass(frozen=True)
class Member:
    """A tether node of the environment."""

    name: str
    role: str
    agent_state: str  # provisioning | provisioned | failed | offline
    joined: bool  # its kubeadm init/join step succeeded
    kubelet: str = ""
    runtime: str = ""
    failure: str = ""  # "step: message" of a failed step
    conditions: tuple[NodeCondition, ...] = ()


@dataclass(frozen=True)
class NodeHealth:
    name: str
    role: str
    ready: bool
    version: str
    internal_ip: str
    agent_state: str
    kubelet: str
    runtime: str
    joined: bool
    conditions: tuple[NodeCondition, ...] = ()


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Report:
    environment: str
    available: bool
    api_server: str
    conditions: tuple[Condition, ...]
    nodes: tuple[NodeHealth, ...]
    endpoint: str
    init_node: str
    desired_control_planes: int
    desired_workers: int


def assess(
    environment: str,
    members: Sequence[Member],
    view: ClusterView | None,
    *,
    desired_control_planes: int,
    desired_workers: int,
    endpoint: str = "",
    init_node: str = "",
) -> Report:
    api = view.api_server if view is not None else "unknown"
    in_cluster = {n.name: n for n in view.nodes} if view is not None else {}
    nodes = []
    for m in sorted(members, key=lambda m: (m.role != Role.CONTROL_PLANE.value, m.name)):
        k = in_cluster.get(m.name)
        nodes.append(
            NodeHealth(
                name=m.name,
                role=m.role,
                ready=bool(k and k.ready),
                version=k.version if k else "",
                internal_ip=k.internal_ip if k else "",
                agent_state=m.agent_state,
                kubelet=m.kubelet,
                runtime=m.runtime,
                joined=m.joined,
                conditions=m.conditions,
            )
        )
    ready_cp = sum(1 for n in nodes if n.ready and n.role == Role.CONTROL_PLANE.value)
    ready_workers = sum(1 for n in nodes if n.ready and n.role == Role.WORKER.value)
    failed = [m for m in members if m.agent_state == "failed"]
    offline = [m for m in members if m.agent_state == "offline"]
    not_ready = [n for n in nodes if n.joined and not n.ready]
    waiting = [n for n in nodes if not n.joined and n.agent_state not in ("failed", "offline")]
    enough = ready_cp >= desired_control_planes and ready_workers >= desired_workers
    available = api == "running" and enough and not failed and all(n.ready for n in nodes)

    degraded_reasons = []
    if failed:
        degraded_reasons.append(
            "failed: " + ", ".join(f"{m.name} ({m.failure})" if m.failure else m.name for m in failed)
        )
    if offline:
        degraded_reasons.append("offline: " + ", ".join(m.name for m in offline))
    if api == "unreachable":
        degraded_reasons.append("the API server is unreachable")
    if not_ready and api == "running":
        degraded_reasons.append("not Ready: " + ", ".join(n.name for n in not_ready))
    drifted = [m for m in members if m.conditions]
    if drifted:
        degraded_reasons.append(
            "GPU conditions: "
            + ", ".join(f"{m.name} ({', '.join(c.type for c in m.conditions)})" for m in drifted)
        )

    progress = []
    if waiting:
        progress.append(
            f"{len(waiting)} node(s) provisioning or waiting to join: " + ", ".join(n.name for n in waiting)
        )
    missing_cp = max(0, desired_control_planes - sum(1 for n in nodes if n.role == Role.CONTROL_PLANE.value))
    missing_w = max(0, desired_workers - sum(1 for n in nodes if n.role == Role.WORKER.value))
    if missing_cp or missing_w:
        progress.append(f"waiting for {missing_cp} control plane(s) and {missing_w} worker(s) to enroll")
    if api == "unknown" and not failed:
        progress.append("no control plane has reported the cluster yet")

    summary = (
        f"{ready_cp}/{desired_control_planes} control planes and "
        f"{ready_workers}/{desired_workers} workers Ready"
    )
    conditions = (
        Condition("Available", available, "AllNodesReady" if available else "NotReady", summary),
        Condition(
            "Progressing",
            bool(progress) and not available,
            "Joining" if progress else "Settled",
            "; ".join(progress) or "nothing pending",
        ),
        Condition(
            "Degraded",
            bool(degraded_reasons),
            "Problems" if degraded_reasons else "Healthy",
            "; ".join(degraded_reasons) or "no problems",
        ),
    )
    return Report(
        environment=environment,
        available=available,
        api_server=api,
        conditions=conditions,
        nodes=tuple(nodes),
        endpoint=endpoint,
        init_node=init_node,
        desired_control_planes=desired_control_planes,
        desired_workers=desired_workers,
    )
