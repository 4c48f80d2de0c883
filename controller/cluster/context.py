"""What rendering needs to know about a node's place in its cluster."""

from __future__ import annotations

import enum
from dataclasses import dataclass

# The gate every joining node waits at, and the names of the cluster steps.
JOIN_GATE = "cluster-join"
INIT_STEP = "kubeadm-init"
JOIN_STEP = "kubeadm-join"
API_PORT = 6443


class Position(str, enum.Enum):
    INIT = "init"  # the control plane that runs kubeadm init (decided once, durably)
    CONTROL_PLANE = "control-plane"  # joins with --control-plane and the certificate key
    WORKER = "worker"


@dataclass(frozen=True)
class ClusterContext:
    position: Position
    # Control planes share certificates through kubeadm's upload-certs (more than one control plane).
    upload_certs: bool = False
    # HA: the load-balancer endpoint (host:port) in front of the API servers; "" without HA.
    ha_endpoint: str = ""
    dedicated_control_plane: bool = False

    @property
    def control_plane(self) -> bool:
        return self.position is not Position.WORKER
