"""The controller's parts, wired together once and handed to the servicers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tether.controller.agentbundles import AgentBundles
from tether.controller.auth import Authenticator
from tether.controller.ca import CertificateAuthority
from tether.controller.cluster.orchestrator import Orchestrator
from tether.controller.config import ControllerConfig
from tether.controller.gates import GateKeeper, NoGates
from tether.controller.hardware.drift import DriftWatch
from tether.controller.hardware.gate import HardwareGate
from tether.controller.hub import Hub
from tether.controller.nodewatch import NodeWatch
from tether.controller.planner import Planner
from tether.controller.progress import Progress
from tether.controller.rollout import RolloutDriver
from tether.controller.store import Store
from tether.nodeagent.secrets import PROCESS_REDACTOR, Redactor

if TYPE_CHECKING:
    from tether.controller.replicas.wiring import Replicas


@dataclass
class App:
    config: ControllerConfig
    ca: CertificateAuthority
    store: Store
    auth: Authenticator
    hub: Hub
    planner: Planner
    advertise: str
    cluster: Orchestrator
    rollouts: RolloutDriver
    gates: GateKeeper = field(default_factory=NoGates)
    redactor: Redactor = field(default_factory=lambda: PROCESS_REDACTOR)
    bundles: AgentBundles | None = None  # the agent versions it hands out (agent upgrades)
    watch: NodeWatch | None = None  # node state changes for WatchNodes (store writes go through it)
    progress: Progress = field(default_factory=Progress)  # step durations: ETAs and stragglers
    hardware: HardwareGate | None = None  # spec.hardware's gate, in front of ``gates`` (quarantine)
    drift: DriftWatch | None = None  # GPU conditions from health reports (spec.hardware.gpus)
    replicas: Replicas | None = None  # the replicas sharing the store, and whether this one leads
