"""The messages simulated agents send, and the bare baseline's canned replies of the same sizes.

Everything is built with the real wire conversions (``tether.nodeagent.wire``), so the bytes a
simulated agent sends are the bytes a real agent on this machine would send.
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
from pathlib import Path
from typing import Any

from tether.nodeagent import __version__, facts, wire
from tether.nodeagent.model import Event, EventKind, Health, HostFacts, Plan, Step, now_ms

CONNECT = "/tether.v1.AgentService/Connect"
ENROLL = "/tether.v1.AgentService/Enroll"
BARE_CONNECT = "/bench.Bare/Connect"
BARE_ENROLL = "/bench.Bare/Enroll"

# The environment every simulated node is enrolled into: three small steps (plan rendering is
# cached per (environment, generation, facts), so its size is what matters here).
BENCH_ENV = "bench"
BENCH_STEPS = (
    ("prepare", 'echo "preparing $TETHER_NODE"\nmkdir -p /tmp/tether-bench\n'),
    ("configure", "echo configured\n"),
    ("verify", "test -d /tmp/tether-bench && echo ok\n"),
)

# An output line of the size apt/dnf/kubeadm print (about 90 bytes).
OUTPUT_LINE = "Setting up nvidia-container-toolkit-base (1.17.8-1) ... unpacking into /usr/bin [{n:>8}]"


def environment_yaml(name: str, steps: tuple[tuple[str, str], ...]) -> str:
    lines = [
        "apiVersion: holodeck.nvidia.com/v1alpha1",
        "kind: Environment",
        "metadata:",
        f"  name: {name}",
        "spec:",
        "  customTemplates:",
    ]
    for step_name, script in steps:
        lines.append(f"    - name: {step_name}")
        lines.append("      phase: pre-install")
        lines.append("      inline: |")
        lines.extend(f"        {s}" for s in script.rstrip("\n").split("\n"))
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=1)
def host_facts() -> HostFacts:
    return facts.collect_facts("127.0.0.1:7443")


def node_facts(node: str) -> HostFacts:
    return dataclasses.replace(host_facts(), hostname=node)


@functools.lru_cache(maxsize=1)
def health() -> Health:
    """This machine's health report, as a node running kubelet and containerd would send it."""
    h = facts.collect_health(Path(tempfile.gettempdir()), gpus=False)
    return dataclasses.replace(
        h, services={"containerd": "active", "kubelet": "active", "tether-agent": "active"}, cluster=None
    )


def health_message() -> wire.pb.AgentMessage:
    return wire.pb.AgentMessage(health=wire.health_to_pb(health()))


def hello_message(
    node: str, next_seq: int, acked: int, plan_digest: str = "", plan_generation: int = 0
) -> wire.pb.AgentMessage:
    return wire.pb.AgentMessage(
        hello=wire.pb.Hello(
            agent_version=__version__,
            facts=wire.facts_to_pb(node_facts(node)),
            last_acked_seq=acked,
            next_seq=next_seq,
            plan_digest=plan_digest,
            plan_generation=plan_generation,
        )
    )


def output_event(seq: int, step: str, lines: tuple[str, ...], message: str = "") -> Event:
    return Event(
        kind=EventKind.OUTPUT,
        step=step,
        digest="0" * 64,
        seq=seq,
        time_ms=now_ms(),
        attempt=1,
        lines=lines,
        message=message,
        plan_generation=1,
    )


def output_lines(n: int, start: int = 0) -> tuple[str, ...]:
    return tuple(OUTPUT_LINE.format(n=start + i) for i in range(n))


def bench_plan() -> Plan:
    steps = [
        Step(name=f"custom-{name}", phase="pre-install", script=script, component="custom")
        for name, script in BENCH_STEPS
    ]
    return Plan.build(steps, generation=1, environment=BENCH_ENV, role="worker")


@functools.lru_cache(maxsize=4)
def canned_replies(heartbeat: int) -> dict[str, bytes]:
    """What the bare baseline answers: real controller messages of the real sizes."""
    pb = wire.pb
    return {
        "welcome": pb.ControllerMessage(
            welcome=pb.Welcome(node_name="bench-00000", stored_seq=100)
        ).SerializeToString(),
        "settings": pb.ControllerMessage(
            settings=pb.Settings(heartbeat_seconds=heartbeat)
        ).SerializeToString(),
        "plan": pb.ControllerMessage(plan=wire.plan_to_pb(bench_plan())).SerializeToString(),
        # A large seq of the same varint size as the real ones; the bare agent acks by count.
        "ack": pb.ControllerMessage(ack=pb.Ack(seq=1_000_000)).SerializeToString(),
    }


# First byte of a serialized AgentMessage: (field number << 3) | 2 for the oneof member.
TAG_HELLO = (1 << 3) | 2
TAG_EVENTS = (2 << 3) | 2
TAG_HEALTH = (3 << 3) | 2


def provision_events(plan: Any) -> list[tuple[Any, int]]:
    """What a simulated agent reports for ``plan`` (a ``common_pb2.Plan``), without seq numbers:
    one INFO event, then each step's STARTED, OUTPUT and SUCCEEDED; each with its line count."""
    from tether.v1 import common_pb2

    events: list[tuple[Any, int]] = [
        (
            common_pb2.Event(
                kind=common_pb2.EVENT_KIND_INFO,
                time_ms=now_ms(),
                message=f"plan generation {plan.generation} received ({len(plan.steps)} steps)",
                plan_generation=plan.generation,
            ),
            0,
        )
    ]
    for step in plan.steps:
        for kind, lines in (
            (common_pb2.EVENT_KIND_STARTED, ()),
            (common_pb2.EVENT_KIND_OUTPUT, (f"{step.name}: ok",)),
            (common_pb2.EVENT_KIND_SUCCEEDED, ()),
        ):
            event = common_pb2.Event(
                kind=kind,
                time_ms=now_ms(),
                step=step.name,
                digest=step.digest,
                attempt=1,
                lines=lines,
                plan_generation=plan.generation,
                duration_seconds=0.01 if kind == common_pb2.EVENT_KIND_SUCCEEDED else 0.0,
            )
            events.append((event, len(lines)))
    return events
