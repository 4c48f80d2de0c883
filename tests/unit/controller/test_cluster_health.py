"""Cluster conditions from agent reports."""

from __future__ import annotations

from tether.controller.cluster.health import Member, assess
from tether.nodeagent.model import ClusterNode, ClusterView

CP, W = "control-plane", "worker"


def view(*ready: tuple[str, bool], api: str = "running") -> ClusterView:
    return ClusterView(
        api_server=api,
        time_ms=1,
        nodes=tuple(
            ClusterNode(name=n, ready=r, version="v1.31.4", internal_ip=f"10.0.0.{i}")
            for i, (n, r) in enumerate(ready)
        ),
    )


def members(*spec: tuple[str, str, str, bool]) -> list[Member]:
    return [
        Member(name=n, role=role, agent_state=state, joined=joined, kubelet="active")
        for n, role, state, joined in spec
    ]


def conditions(report: object) -> dict[str, bool]:
    return {c.type: c.status for c in report.conditions}  # type: ignore[attr-defined]


def test_all_ready_is_available() -> None:
    r = assess(
        "e",
        members(("cp", CP, "provisioned", True), ("w1", W, "provisioned", True)),
        view(("cp", True), ("w1", True)),
        desired_control_planes=1,
        desired_workers=1,
    )
    assert r.available
    assert conditions(r) == {"Available": True, "Progressing": False, "Degraded": False}
    assert [(n.name, n.ready, n.internal_ip) for n in r.nodes] == [
        ("cp", True, "10.0.0.0"),
        ("w1", True, "10.0.0.1"),
    ]


def test_nodes_still_joining_is_progressing_not_degraded() -> None:
    r = assess(
        "e",
        members(("cp", CP, "provisioned", True), ("w1", W, "provisioning", False)),
        view(("cp", True)),
        desired_control_planes=1,
        desired_workers=1,
    )
    assert not r.available
    assert conditions(r) == {"Available": False, "Progressing": True, "Degraded": False}


def test_fewer_nodes_than_the_spec_wants_is_not_available() -> None:
    r = assess(
        "e",
        members(("cp", CP, "provisioned", True)),
        view(("cp", True)),
        desired_control_planes=1,
        desired_workers=2,
    )
    assert not r.available and "0 control plane(s) and 2 worker(s)" in r.conditions[1].message


def test_failed_offline_and_not_ready_are_degraded() -> None:
    ms = [
        Member("cp", CP, "provisioned", True),
        Member("w1", W, "failed", False, failure="kubeadm-join: exit 1"),
        Member("w2", W, "offline", True),
        Member("w3", W, "provisioned", True),
    ]
    r = assess(
        "e", ms, view(("cp", True), ("w2", True), ("w3", False)), desired_control_planes=1, desired_workers=3
    )
    degraded = r.conditions[2]
    assert degraded.status and not r.available
    assert "w1 (kubeadm-join: exit 1)" in degraded.message and "offline: w2" in degraded.message
    assert "not Ready: w3" in degraded.message


def test_unreachable_api_is_degraded_and_no_view_is_unknown() -> None:
    ms = members(("cp", CP, "provisioned", True))
    assert conditions(assess("e", ms, view(api="unreachable"), desired_control_planes=1, desired_workers=0))[
        "Degraded"
    ]
    r = assess("e", ms, None, desired_control_planes=1, desired_workers=0)
    assert r.api_server == "unknown" and not r.available
