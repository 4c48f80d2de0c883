"""Wire conversion: every field survives the trip through protobuf."""

from __future__ import annotations

from tether.nodeagent import wire
from tether.nodeagent.model import (
    ClusterNode,
    ClusterView,
    Event,
    EventKind,
    Gpu,
    Health,
    HostFacts,
    Plan,
    Step,
    facts_from_dict,
    health_from_dict,
)

GPU = Gpu(
    index=0,
    name="NVIDIA H200",
    uuid="GPU-1",
    driver_version="580.1",
    memory_total_mib=143771,
    pci_bus_id="00000000:19:00.0",
)


def test_plan_round_trip_keeps_every_step_field() -> None:
    step = Step(
        name="s1",
        script="echo hi\n",
        phase="pre-install",
        timeout_seconds=7,
        retries=2,
        continue_on_error=True,
        reboot=True,
        gate="join",
        env={"A": "b"},
        secret_env=("TOKEN",),
        component="custom",
        description="d",
        requested={"version": "1"},
    )
    plan = Plan.build([step], generation=3, environment="e", role="worker")
    back = wire.plan_from_pb(wire.plan_to_pb(plan))
    assert back == plan
    assert back.steps[0].digest == step.compute_digest()


def test_event_round_trip() -> None:
    e = Event(
        kind=EventKind.FAILED,
        step="s",
        digest="d",
        seq=9,
        time_ms=5,
        attempt=2,
        exit_code=3,
        lines=("a", "b"),
        message="m",
        observed={"k": "v"},
        plan_generation=4,
        duration_seconds=1.5,
        node="n",
    )
    assert wire.event_from_pb(wire.event_to_pb(e)) == e


def test_unknown_event_kind_from_a_newer_peer_becomes_unspecified() -> None:
    msg = wire.event_to_pb(Event(kind=EventKind.OUTPUT))
    msg.kind = 99  # type: ignore[assignment]
    assert wire.event_from_pb(msg).kind is EventKind.UNSPECIFIED


def test_facts_round_trip_and_dict_round_trip() -> None:
    import dataclasses

    f = HostFacts(
        hostname="h",
        os_id="ubuntu",
        os_version_id="22.04",
        os_pretty="Ubuntu",
        os_family="debian",
        arch="amd64",
        kernel="6.1",
        python_version="3.10.12",
        systemd=True,
        docker=False,
        nvidia_gpu=True,
        gpus=(GPU,),
        addresses=("10.0.0.2",),
        boot_id="b",
        machine_id="m",
    )
    assert wire.facts_from_pb(wire.facts_to_pb(f)) == f
    assert facts_from_dict(dataclasses.asdict(f)) == f
    assert f.os_key == "ubuntu-22.04"


def test_health_round_trip_with_and_without_cluster_view() -> None:
    import dataclasses

    view = ClusterView(
        api_server="running",
        time_ms=3,
        nodes=(
            ClusterNode(
                name="cp", ready=True, version="v1.31.0", internal_ip="10.0.0.2", roles=("control-plane",)
            ),
        ),
    )
    h = Health(
        time_ms=1,
        os="Ubuntu",
        arch="amd64",
        kernel="6.1",
        uptime_seconds=5.5,
        load1=0.1,
        load5=0.2,
        load15=0.3,
        memory_total_bytes=10,
        memory_available_bytes=5,
        disk_total_bytes=100,
        disk_free_bytes=50,
        agent_version="0.1.0",
        gpus=(GPU,),
        services={"kubelet": "active"},
        cluster=view,
    )
    assert wire.health_from_pb(wire.health_to_pb(h)) == h
    assert health_from_dict(dataclasses.asdict(h)) == h
    bare = Health(time_ms=1)
    assert wire.health_from_pb(wire.health_to_pb(bare)).cluster is None
