"""The agent's side of the wire: the only agent module that imports ``*_pb2``.

Converts the shared types (plans, steps, events, facts, health) between
protobuf messages and ``tether.nodeagent.model``. The controller's ``wire`` reuses
these for the common types.
"""

from __future__ import annotations

from collections.abc import Iterable

from tether.nodeagent.model import (
    AgentTarget,
    ClusterNode,
    ClusterView,
    Event,
    EventKind,
    Gpu,
    Health,
    HostFacts,
    PciGpu,
    Plan,
    Step,
)
from tether.v1 import agent_pb2, agent_pb2_grpc, common_pb2

pb = agent_pb2
common = common_pb2
AgentServiceStub = agent_pb2_grpc.AgentServiceStub


def step_to_pb(s: Step) -> common_pb2.Step:
    return common_pb2.Step(
        name=s.name,
        phase=s.phase,
        script=s.script,
        digest=s.digest,
        timeout_seconds=s.timeout_seconds,
        retries=s.retries,
        continue_on_error=s.continue_on_error,
        reboot=s.reboot,
        gate=s.gate,
        env=dict(s.env),
        secret_env=list(s.secret_env),
        component=s.component,
        description=s.description,
        requested=dict(s.requested),
    )


def step_from_pb(m: common_pb2.Step) -> Step:
    return Step(
        name=m.name,
        phase=m.phase,
        script=m.script,
        digest=m.digest,
        timeout_seconds=m.timeout_seconds,
        retries=m.retries,
        continue_on_error=m.continue_on_error,
        reboot=m.reboot,
        gate=m.gate,
        env=dict(m.env),
        secret_env=tuple(m.secret_env),
        component=m.component,
        description=m.description,
        requested=dict(m.requested),
    )


def plan_to_pb(p: Plan) -> common_pb2.Plan:
    return common_pb2.Plan(
        generation=p.generation,
        digest=p.digest,
        steps=[step_to_pb(s) for s in p.steps],
        environment=p.environment,
        role=p.role,
        agent=common_pb2.AgentTarget(version=p.agent.version, sha256=p.agent.sha256, size=p.agent.size)
        if p.agent
        else None,
        deprovision=p.deprovision,
    )


def plan_from_pb(m: common_pb2.Plan) -> Plan:
    agent = m.agent if m.HasField("agent") and m.agent.version else None
    return Plan(
        steps=tuple(step_from_pb(s) for s in m.steps),
        generation=m.generation,
        environment=m.environment,
        role=m.role,
        digest=m.digest,
        agent=AgentTarget(agent.version, agent.sha256, agent.size) if agent else None,
        deprovision=m.deprovision,
    )


def event_to_pb(e: Event) -> common_pb2.Event:
    return common_pb2.Event(
        seq=e.seq,
        time_ms=e.time_ms,
        kind=common_pb2.EventKind.ValueType(e.kind),
        step=e.step,
        digest=e.digest,
        attempt=e.attempt,
        exit_code=e.exit_code,
        lines=list(e.lines),
        message=e.message,
        observed=dict(e.observed),
        plan_generation=e.plan_generation,
        duration_seconds=e.duration_seconds,
        node=e.node,
        will_retry=e.will_retry,
    )


def event_from_pb(m: common_pb2.Event) -> Event:
    try:
        kind = EventKind(m.kind)
    except ValueError:
        kind = EventKind.UNSPECIFIED
    return Event(
        kind=kind,
        step=m.step,
        digest=m.digest,
        seq=m.seq,
        time_ms=m.time_ms,
        attempt=m.attempt,
        exit_code=m.exit_code,
        lines=tuple(m.lines),
        message=m.message,
        observed=dict(m.observed),
        plan_generation=m.plan_generation,
        duration_seconds=m.duration_seconds,
        node=m.node,
        will_retry=m.will_retry,
    )


def events_to_pb(events: Iterable[Event]) -> agent_pb2.EventBatch:
    return agent_pb2.EventBatch(events=[event_to_pb(e) for e in events])


# The AgentMessage around an EventBatch: its field tag and length (at most 1 + 10 bytes).
BATCH_ENVELOPE_BYTES = 16


def varint_bytes(n: int) -> int:
    """Bytes of ``n`` as a protobuf varint."""
    return max(1, (n.bit_length() + 6) // 7)


def batch_cost(e: Event) -> int:
    """What ``e`` adds to an encoded EventBatch: its tag, its length and itself."""
    n = event_to_pb(e).ByteSize()
    return 1 + varint_bytes(n) + n


def line_cost(line: str) -> int:
    """What one more output line adds to an encoded Event (``lines`` is field 8: one tag byte)."""
    n = len(line.encode())
    return 1 + varint_bytes(n) + n


def gpu_to_pb(g: Gpu) -> common_pb2.Gpu:
    return common_pb2.Gpu(
        index=g.index,
        name=g.name,
        uuid=g.uuid,
        driver_version=g.driver_version,
        memory_total_mib=g.memory_total_mib,
        pci_bus_id=g.pci_bus_id,
        ecc_uncorrected=g.ecc_uncorrected,
        xid_errors=g.xid_errors,
    )


def pci_gpu_to_pb(g: PciGpu) -> common_pb2.PciGpu:
    return common_pb2.PciGpu(address=g.address, device_id=g.device_id, name=g.name)


def pci_gpu_from_pb(m: common_pb2.PciGpu) -> PciGpu:
    return PciGpu(address=m.address, device_id=m.device_id, name=m.name)


def gpu_from_pb(m: common_pb2.Gpu) -> Gpu:
    return Gpu(
        index=m.index,
        name=m.name,
        uuid=m.uuid,
        driver_version=m.driver_version,
        memory_total_mib=m.memory_total_mib,
        pci_bus_id=m.pci_bus_id,
        ecc_uncorrected=m.ecc_uncorrected,
        xid_errors=m.xid_errors,
    )


def facts_to_pb(f: HostFacts) -> common_pb2.HostFacts:
    return common_pb2.HostFacts(
        hostname=f.hostname,
        os_id=f.os_id,
        os_version_id=f.os_version_id,
        os_pretty=f.os_pretty,
        os_family=f.os_family,
        arch=f.arch,
        kernel=f.kernel,
        python_version=f.python_version,
        systemd=f.systemd,
        docker=f.docker,
        nvidia_gpu=f.nvidia_gpu,
        gpus=[gpu_to_pb(g) for g in f.gpus],
        addresses=list(f.addresses),
        boot_id=f.boot_id,
        machine_id=f.machine_id,
        cpu_count=f.cpu_count,
        memory_total_bytes=f.memory_total_bytes,
        pci_gpus=[pci_gpu_to_pb(g) for g in f.pci_gpus],
    )


def facts_from_pb(m: common_pb2.HostFacts) -> HostFacts:
    return HostFacts(
        hostname=m.hostname,
        os_id=m.os_id,
        os_version_id=m.os_version_id,
        os_pretty=m.os_pretty,
        os_family=m.os_family or "unknown",
        arch=m.arch,
        kernel=m.kernel,
        python_version=m.python_version,
        systemd=m.systemd,
        docker=m.docker,
        nvidia_gpu=m.nvidia_gpu,
        gpus=tuple(gpu_from_pb(g) for g in m.gpus),
        addresses=tuple(m.addresses),
        boot_id=m.boot_id,
        machine_id=m.machine_id,
        cpu_count=m.cpu_count,
        memory_total_bytes=m.memory_total_bytes,
        pci_gpus=tuple(pci_gpu_from_pb(g) for g in m.pci_gpus),
    )


def cluster_to_pb(c: ClusterView) -> common_pb2.ClusterView:
    return common_pb2.ClusterView(
        api_server=c.api_server,
        time_ms=c.time_ms,
        nodes=[
            common_pb2.ClusterNode(
                name=n.name, ready=n.ready, version=n.version, internal_ip=n.internal_ip, roles=list(n.roles)
            )
            for n in c.nodes
        ],
    )


def cluster_from_pb(m: common_pb2.ClusterView) -> ClusterView:
    return ClusterView(
        api_server=m.api_server or "unknown",
        time_ms=m.time_ms,
        nodes=tuple(
            ClusterNode(
                name=n.name, ready=n.ready, version=n.version, internal_ip=n.internal_ip, roles=tuple(n.roles)
            )
            for n in m.nodes
        ),
    )


def health_to_pb(h: Health) -> common_pb2.Health:
    msg = common_pb2.Health(
        time_ms=h.time_ms,
        os=h.os,
        arch=h.arch,
        kernel=h.kernel,
        uptime_seconds=h.uptime_seconds,
        load1=h.load1,
        load5=h.load5,
        load15=h.load15,
        memory_total_bytes=h.memory_total_bytes,
        memory_available_bytes=h.memory_available_bytes,
        disk_total_bytes=h.disk_total_bytes,
        disk_free_bytes=h.disk_free_bytes,
        agent_version=h.agent_version,
        gpus=[gpu_to_pb(g) for g in h.gpus],
        services=dict(h.services),
        pci_gpus=[pci_gpu_to_pb(g) for g in h.pci_gpus],
    )
    if h.cluster is not None:
        msg.cluster.CopyFrom(cluster_to_pb(h.cluster))
    return msg


def health_from_pb(m: common_pb2.Health) -> Health:
    return Health(
        time_ms=m.time_ms,
        os=m.os,
        arch=m.arch,
        kernel=m.kernel,
        uptime_seconds=m.uptime_seconds,
        load1=m.load1,
        load5=m.load5,
        load15=m.load15,
        memory_total_bytes=m.memory_total_bytes,
        memory_available_bytes=m.memory_available_bytes,
        disk_total_bytes=m.disk_total_bytes,
        disk_free_bytes=m.disk_free_bytes,
        agent_version=m.agent_version,
        gpus=tuple(gpu_from_pb(g) for g in m.gpus),
        services=dict(m.services),
        cluster=cluster_from_pb(m.cluster) if m.HasField("cluster") else None,
        pci_gpus=tuple(pci_gpu_from_pb(g) for g in m.pci_gpus),
    )
