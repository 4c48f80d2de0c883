"""The domain types every tether component uses (plans, steps, events, facts).

Wire types never leave ``wire.py``; everything else works with these.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from tether.nodeagent.errors import CorruptRecord

R = TypeVar("R")
# What decoding a damaged record raises inside the decoders below (wrong types, missing keys).
_DAMAGE = (KeyError, TypeError, ValueError, AttributeError, OverflowError, IndexError)


def decoder(what: str) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """A stored-record decoder that raises ``CorruptRecord`` (one line) instead of whatever a
    damaged record makes it trip over."""

    def wrap(fn: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(fn)
        def decode(*args: Any) -> R:
            try:
                return fn(*args)
            except _DAMAGE as exc:
                raise CorruptRecord(f"damaged {what} record ({type(exc).__name__}: {exc})") from None

        return decode

    return wrap


def now_ms() -> int:
    return int(time.time() * 1000)


class EventKind(enum.IntEnum):
    """Mirrors ``tether.v1.EventKind`` (values are the wire numbers)."""

    UNSPECIFIED = 0
    STARTED = 1
    OUTPUT = 2
    SUCCEEDED = 3
    FAILED = 4
    SKIPPED = 5
    WAITING = 6
    INFO = 7

    @property
    def label(self) -> str:
        return self.name.lower()


class StepState(str, enum.Enum):
    """Where a step stands in a node's journal."""

    PENDING = "pending"
    RUNNING = "running"
    RETRYING = "retrying"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"


class Role(str, enum.Enum):
    CONTROL_PLANE = "control-plane"
    WORKER = "worker"

    @classmethod
    def parse(cls, value: str) -> Role:
        aliases = {"controlplane": "control-plane", "cp": "control-plane", "control_plane": "control-plane"}
        try:
            return cls(aliases.get(value, value))
        except ValueError:
            raise ValueError(f"unknown role {value!r} (expected control-plane or worker)") from None


@dataclass(frozen=True)
class Step:
    """One bash script of a plan and how to run it. Never holds a secret value."""

    name: str
    script: str
    phase: str = ""
    timeout_seconds: int = 600
    retries: int = 0
    continue_on_error: bool = False
    reboot: bool = False
    gate: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: tuple[str, ...] = ()
    component: str = ""
    description: str = ""
    requested: Mapping[str, str] = field(default_factory=dict)  # informational; not part of the digest
    digest: str = ""

    def compute_digest(self) -> str:
        """SHA-256 over everything that defines what the step does."""
        doc = {
            "name": self.name,
            "script": self.script,
            "timeout": self.timeout_seconds,
            "retries": self.retries,
            "continue_on_error": self.continue_on_error,
            "reboot": self.reboot,
            "gate": self.gate,
            "env": sorted(self.env.items()),
            "secret_env": sorted(self.secret_env),
        }
        raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(raw).hexdigest()

    def sealed(self) -> Step:
        """This step with its digest filled in."""
        return replace(self, digest=self.compute_digest())


@dataclass(frozen=True)
class AgentTarget:
    """The agent version a plan asks for: its bundle's SHA-256 and size (FetchAgentBundle)."""

    version: str
    sha256: str
    size: int = 0


@dataclass(frozen=True)
class Plan:
    """The ordered steps rendered for one node, and the agent version it should run."""

    steps: tuple[Step, ...]
    generation: int = 0
    environment: str = ""
    role: str = ""
    digest: str = ""
    agent: AgentTarget | None = None
    # A reset: run these steps (leave the cluster), then the agent removes itself, its config and
    # state (``tether.nodeagent.deprovision``).
    deprovision: bool = False

    @staticmethod
    def build(
        steps: list[Step] | tuple[Step, ...],
        *,
        generation: int = 0,
        environment: str = "",
        role: str = "",
        agent: AgentTarget | None = None,
        deprovision: bool = False,
    ) -> Plan:
        sealed = tuple(s if s.digest else s.sealed() for s in steps)
        names = [s.name for s in sealed]
        if len(set(names)) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate step names in plan: {', '.join(dupes)}")
        lines = [s.digest for s in sealed] + ([f"agent {agent.version} {agent.sha256}"] if agent else [])
        lines += ["deprovision"] if deprovision else []
        digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
        return Plan(
            steps=sealed,
            generation=generation,
            environment=environment,
            role=role,
            digest=digest,
            agent=agent,
            deprovision=deprovision,
        )

    def step(self, name: str) -> Step | None:
        for s in self.steps:
            if s.name == name:
                return s
        return None


@dataclass(frozen=True)
class Event:
    """A step or node event. ``seq`` is per node, assigned by the agent's outbox."""

    kind: EventKind
    step: str = ""
    digest: str = ""
    seq: int = 0
    time_ms: int = 0
    attempt: int = 0
    exit_code: int = 0
    lines: tuple[str, ...] = ()
    message: str = ""
    observed: Mapping[str, str] = field(default_factory=dict)
    plan_generation: int = 0
    duration_seconds: float = 0.0
    node: str = ""
    will_retry: bool = False  # FAILED, but another attempt follows

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "time_ms": self.time_ms,
            "kind": self.kind.label,
            "step": self.step,
            "digest": self.digest,
            "attempt": self.attempt,
            "exit_code": self.exit_code,
            "lines": list(self.lines),
            "message": self.message,
            "observed": dict(self.observed),
            "plan_generation": self.plan_generation,
            "duration_seconds": self.duration_seconds,
            "node": self.node,
            "will_retry": self.will_retry,
        }

    @staticmethod
    @decoder("event")
    def from_json(doc: Mapping[str, Any]) -> Event:
        return Event(
            kind=EventKind[str(doc["kind"]).upper()],
            step=str(doc.get("step", "")),
            digest=str(doc.get("digest", "")),
            seq=int(doc.get("seq", 0)),
            time_ms=int(doc.get("time_ms", 0)),
            attempt=int(doc.get("attempt", 0)),
            exit_code=int(doc.get("exit_code", 0)),
            lines=tuple(doc.get("lines", ())),
            message=str(doc.get("message", "")),
            observed=dict(doc.get("observed", {})),
            plan_generation=int(doc.get("plan_generation", 0)),
            duration_seconds=float(doc.get("duration_seconds", 0.0)),
            node=str(doc.get("node", "")),
            will_retry=bool(doc.get("will_retry", False)),
        )


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str = ""
    driver_version: str = ""
    memory_total_mib: int = 0
    pci_bus_id: str = ""
    ecc_uncorrected: int = 0  # uncorrected ECC errors since the driver loaded
    xid_errors: int = 0  # Xid errors the kernel logged for this GPU since boot


@dataclass(frozen=True)
class PciGpu:
    """An NVIDIA GPU on the PCI bus (no driver needed)."""

    address: str
    device_id: str = ""
    name: str = ""  # from pci.ids, "" when unknown


@dataclass(frozen=True)
class HostFacts:
    """What a node says about itself."""

    hostname: str = ""
    os_id: str = ""
    os_version_id: str = ""
    os_pretty: str = ""
    os_family: str = "unknown"
    arch: str = ""
    kernel: str = ""
    python_version: str = ""
    systemd: bool = False
    docker: bool = False
    nvidia_gpu: bool = False
    gpus: tuple[Gpu, ...] = ()
    addresses: tuple[str, ...] = ()
    boot_id: str = ""
    machine_id: str = ""
    cpu_count: int = 0
    memory_total_bytes: int = 0
    pci_gpus: tuple[PciGpu, ...] = ()

    @property
    def os_key(self) -> str:
        """``ubuntu-22.04`` style identifier, as in the spec's ``instance.os``."""
        os_id = {"amzn": "amazon-linux"}.get(self.os_id, self.os_id)
        return f"{os_id}-{self.os_version_id}" if self.os_version_id else os_id


@dataclass(frozen=True)
class ClusterNode:
    name: str
    ready: bool
    version: str = ""
    internal_ip: str = ""
    roles: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterView:
    api_server: str = "unknown"
    nodes: tuple[ClusterNode, ...] = ()
    time_ms: int = 0


@dataclass(frozen=True)
class Health:
    time_ms: int = 0
    os: str = ""
    arch: str = ""
    kernel: str = ""
    uptime_seconds: float = 0.0
    load1: float = 0.0
    load5: float = 0.0
    load15: float = 0.0
    memory_total_bytes: int = 0
    memory_available_bytes: int = 0
    disk_total_bytes: int = 0
    disk_free_bytes: int = 0
    agent_version: str = ""
    gpus: tuple[Gpu, ...] = ()
    services: Mapping[str, str] = field(default_factory=dict)
    cluster: ClusterView | None = None
    pci_gpus: tuple[PciGpu, ...] = ()


@decoder("host facts")
def facts_from_dict(doc: Mapping[str, Any]) -> HostFacts:
    """Inverse of ``dataclasses.asdict(HostFacts)`` (unknown keys ignored)."""
    known = {f for f in HostFacts.__dataclass_fields__}
    values = {k: v for k, v in doc.items() if k in known}
    values["gpus"] = tuple(Gpu(**g) for g in values.get("gpus", ()))
    values["pci_gpus"] = tuple(PciGpu(**g) for g in values.get("pci_gpus", ()))
    values["addresses"] = tuple(values.get("addresses", ()))
    return HostFacts(**values)


@decoder("health")
def health_from_dict(doc: Mapping[str, Any]) -> Health:
    known = {f for f in Health.__dataclass_fields__}
    values = {k: v for k, v in doc.items() if k in known}
    values["gpus"] = tuple(Gpu(**g) for g in values.get("gpus", ()))
    values["pci_gpus"] = tuple(PciGpu(**g) for g in values.get("pci_gpus", ()))
    cluster = values.get("cluster")
    if cluster:
        values["cluster"] = ClusterView(
            api_server=cluster.get("api_server", "unknown"),
            time_ms=cluster.get("time_ms", 0),
            nodes=tuple(
                ClusterNode(**{**n, "roles": tuple(n.get("roles", ()))}) for n in cluster.get("nodes", ())
            ),
        )
    return Health(**values)
