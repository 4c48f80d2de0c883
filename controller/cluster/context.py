"""What rendering needs to know about a node's place in its cluster."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tether.controller.spec.model import ClusterSpec, EnvironmentSpec

# The gate every joining node waits at, and the names of the cluster steps.
JOIN_GATE = "cluster-join"
INIT_STEP = "kubeadm-init"
JOIN_STEP = "kubeadm-join"
API_PORT = 6443
# spec.rollout.drain: the node's disruptive steps run between these two gated steps.
DRAIN_GATE = "cluster-drain"
UNCORDON_GATE = "cluster-uncordon"
DRAIN_STEP = "drain"
UNCORDON_STEP = "uncordon"
# A reset (``tetherctl node reset``): after kubeadm reset, another control plane deletes the node.
DELETE_NODE_GATE = "cluster-delete-node"
DELETE_NODE_STEP = "delete-node"
# The gated steps a control plane's kubectl task answers (tether.controller.cluster.drain).
DRAIN_GATES = {DRAIN_STEP: DRAIN_GATE, UNCORDON_STEP: UNCORDON_GATE, DELETE_NODE_STEP: DELETE_NODE_GATE}
# What the controller releases those gates with (plain environment: nothing secret).
GATE_RESULT = "TETHER_GATE_RESULT"  # "done", or anything else: the step fails with the message
GATE_MESSAGE = "TETHER_GATE_MESSAGE"
GATE_DONE = "done"
# highAvailability without an endpoint: every node's own load balancer (tether.controller.cluster.
# apiserver_lb) listens on 127.0.0.1:LOCAL_LB_PORT, and LOCAL_LB_NAME is 127.0.0.1 in /etc/hosts.
LOCAL_LB_NAME = "apiserver.tether.internal"
LOCAL_LB_PORT = 7443
LOCAL_LB_ENDPOINT = f"{LOCAL_LB_NAME}:{LOCAL_LB_PORT}"
LOCAL_LB_BACKENDS = "/etc/tether/apiserver-backends"  # the control planes, kept by the controller
LOCAL_LB_SELF = "/etc/tether/apiserver-backends.local"  # a control plane's own API server


class Position(str, enum.Enum):
    INIT = "init"  # the control plane that runs kubeadm init (decided once, durably)
    CONTROL_PLANE = "control-plane"  # joins with --control-plane and the certificate key
    WORKER = "worker"

    @property
    def role(self) -> str:
        return "worker" if self is Position.WORKER else "control-plane"


@dataclass(frozen=True)
class ClusterContext:
    position: Position
    # Control planes share certificates through kubeadm's upload-certs (more than one control plane).
    upload_certs: bool = False
    # HA: the load-balancer endpoint (host:port) in front of the API servers; "" without HA.
    ha_endpoint: str = ""
    dedicated_control_plane: bool = False
    # HA without an endpoint: ha_endpoint is LOCAL_LB_ENDPOINT, each node's own load balancer.
    local_lb: bool = False

    @property
    def control_plane(self) -> bool:
        return self.position is not Position.WORKER


# Kubernetes by kubeadm without spec.cluster: a single node is a cluster of one (one control plane
# that is not dedicated, no workers, no HA), orchestrated like any other: its init node's
# kubeadm-init hands the controller the admin kubeconfig, and cluster health reports it.
SINGLE_NODE = ClusterSpec()


def cluster_of(spec: EnvironmentSpec) -> ClusterSpec | None:
    """The spec's kubeadm cluster (``SINGLE_NODE`` without spec.cluster), or None when Kubernetes is
    not installed by kubeadm."""
    kube = spec.kubernetes
    if not kube.install or kube.installer != "kubeadm":
        return None
    return spec.cluster if spec.cluster is not None else SINGLE_NODE


def context_for(spec: ClusterSpec, position: Position) -> ClusterContext:
    """The context of a node at ``position`` (the orchestrator's, and the offline preview's)."""
    ha = spec.high_availability
    local_lb = ha.enabled and not ha.endpoint
    return ClusterContext(
        position,
        upload_certs=spec.control_plane.count > 1 or ha.enabled,
        ha_endpoint=LOCAL_LB_ENDPOINT if local_lb else with_port(ha.endpoint) if ha.enabled else "",
        dedicated_control_plane=spec.control_plane.dedicated,
        local_lb=local_lb,
    )


def with_port(host: str) -> str:
    """``host`` with the API port when it names none (IPv6 in brackets)."""
    if not host:
        return ""
    if host.startswith("["):
        return host if "]:" in host else f"{host}:{API_PORT}"
    return host if host.count(":") == 1 else f"{host}:{API_PORT}"


def preview_context(spec: EnvironmentSpec, position: str) -> ClusterContext | None:
    """What a node at ``position`` ("" for none) of this spec's cluster gets, for offline previews:
    the same context the orchestrator gives a real node there."""
    if not position:
        return None
    try:
        at = Position(position)
    except ValueError:
        raise ValueError(f"unknown cluster position {position!r} (init, control-plane or worker)") from None
    cluster = cluster_of(spec)
    if cluster is None:
        raise ValueError("a cluster position needs Kubernetes installed by kubeadm")
    return context_for(cluster, at)
