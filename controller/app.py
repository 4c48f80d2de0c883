"""The controller's parts, wired together once and handed to the servicers."""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.agentbundles import AgentBundles
from controller.auth import Authenticator
from controller.ca import CertificateAuthority
from controller.cluster.orchestrator import Orchestrator
from controller.config import ControllerConfig
from controller.gates import GateKeeper, NoGates
from controller.hub import Hub
from controller.planner import Planner
from controller.rollout import RolloutDriver
from controller.store import Store
from nodeagent.secrets import PROCESS_REDACTOR, Redactor


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
