"""kubeadm cluster steps: init on the chosen control plane, gated joins elsewhere.

With ``spec.cluster`` or without it: a single-node kubeadm environment is a cluster of one, its
control plane the init node (plus holodeck's single-node ``kubernetes-ready`` step after Calico).

Rendered after the kubeadm install step when the node has a ``ClusterContext``. Nothing
secret is in any script: the join material arrives as secret environment values of the
gated join step (``secret_env``), written to a 0600 JoinConfiguration on tmpfs for the
duration of the join, and kubeadm's own output is masked before it leaves the step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import yaml

from tether.controller.cluster import material
from tether.controller.cluster.context import (
    INIT_STEP,
    JOIN_GATE,
    JOIN_STEP,
    Position,
    cluster_of,
    context_for,
)
from tether.controller.render.components import kubeadm, kubeadm_config
from tether.controller.render.context import NodeContext
from tether.controller.render.shell import q
from tether.controller.render.steps import RenderInput, make_step
from tether.controller.spec.model import EnvironmentSpec
from tether.nodeagent.model import Step

# Filled in on the node, where the address is known (the agent exports TETHER_NODE_IP and TETHER_NODE).
ADVERTISE = "@ADVERTISE_ADDRESS@"
ENDPOINT = "@CONTROL_PLANE_ENDPOINT@"
NODE_NAME = "@NODE_NAME@"
NODE_SANS = "@NODE_SANS@"  # kubernetes.remoteAccess: one list item that becomes this node's addresses


def extra_sans(inp: RenderInput, sans: list[str]) -> list[str]:
    """K8sEndpointHost (the name operators reach the API by, as in holodeck's single node) and, with
    ``kubernetes.remoteAccess``, every address and name of the init node (filled in on the node)."""
    k8s = inp.spec.kubernetes
    extra = [k8s.endpoint_host] if k8s.endpoint_host and k8s.endpoint_host not in sans else []
    return extra + ([NODE_SANS] if k8s.remote_access else [])


def init_config(inp: RenderInput) -> str:
    """tether's kubeadm configuration, made cluster-aware (the user's config is used verbatim)."""
    user, origin = kubeadm_config.config_text(inp)
    if origin == "user":
        return user
    docs: list[dict[str, Any]] = list(yaml.safe_load_all(user))
    cluster = inp.node.cluster
    assert cluster is not None
    for doc in docs:
        if doc.get("kind") == "InitConfiguration":
            doc.setdefault("nodeRegistration", {})["name"] = NODE_NAME
            doc["localAPIEndpoint"] = {"advertiseAddress": ADVERTISE}
        elif doc.get("kind") == "ClusterConfiguration":
            doc["controlPlaneEndpoint"] = ENDPOINT
            sans = [ADVERTISE]
            if cluster.ha_endpoint:
                sans.insert(0, cluster.ha_endpoint.rsplit(":", 1)[0].strip("[]"))
            sans += extra_sans(inp, sans)
            doc.setdefault("apiServer", {})["certSANs"] = sans
    return str(yaml.safe_dump_all(docs, sort_keys=False))


def init_step(inp: RenderInput) -> Step:
    cluster = inp.node.cluster
    assert cluster is not None
    k8s = inp.spec.kubernetes
    return make_step(
        inp,
        name=INIT_STEP,
        component="kubernetes",
        phase="kubernetes",
        template="cluster_init.j2",
        timeout=1800,
        requested={
            "version": k8s.version if k8s.source == "release" else "built",
            "role": "first control plane",
            "endpoint": cluster.ha_endpoint or "this node",
        },
        description="kubeadm init on the control plane the controller chose; join material to the agent",
        env={"TETHER_KUBEADM_CONFIG": init_config(inp), "HA_ENDPOINT": cluster.ha_endpoint},
        context={
            "upload_certs": cluster.upload_certs,
            "node_sans": kubeadm_config.config_text(inp)[1] == "generated" and k8s.remote_access,
            "built": k8s.source != "release",
            "token_ttl": q(str(material.DEFAULT_TOKEN_TTL_S)),
        },
    )


def join_step(inp: RenderInput) -> Step:
    cluster = inp.node.cluster
    assert cluster is not None
    control_plane = cluster.position is Position.CONTROL_PLANE
    secret_env = [material.TOKEN, material.CA_HASH, material.ENDPOINT]
    if control_plane:
        secret_env.append(material.CERT_KEY)
    step = make_step(
        inp,
        name=JOIN_STEP,
        component="kubernetes",
        phase="kubernetes",
        template="cluster_join.j2",
        timeout=1200,
        requested={"role": "control plane" if control_plane else "worker", "gate": JOIN_GATE},
        description="kubeadm join with material the controller releases just in time",
        context={
            "control_plane": control_plane,
            "api_version": q(kubeadm_config.api_version(inp.spec.kubernetes.version)),
            "cri_socket": q(kubeadm_config.cri_socket(inp)),
        },
    )
    # Three attempts: each one asks the controller again, so a refused token is replaced.
    return replace(step, gate=JOIN_GATE, secret_env=tuple(secret_env), retries=2)


def steps(inp: RenderInput) -> list[Step]:
    cluster = inp.node.cluster
    if cluster is None:
        return []
    if cluster.position is Position.INIT:
        out = [init_step(inp), kubeadm.calico_step(inp)]  # and Calico, once, from here
        if inp.spec.cluster is None:
            out.append(kubeadm.ready_step(inp))  # a single node: untaint, label, wait (holodeck's)
        return out
    return [join_step(inp)]


def single_node_default(spec: EnvironmentSpec, node: NodeContext) -> NodeContext:
    """A node without a cluster position (an offline render) of a single-node kubeadm environment:
    its control plane is the init node of its cluster of one, as the controller would make it."""
    if node.cluster is not None or node.role != Position.INIT.role or spec.cluster is not None:
        return node
    cluster = cluster_of(spec)
    return node if cluster is None else replace(node, cluster=context_for(cluster, Position.INIT))
