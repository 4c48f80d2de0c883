"""kubeadm cluster steps (spec.cluster): init on the chosen control plane, gated joins elsewhere.

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
from tether.controller.cluster.context import INIT_STEP, JOIN_GATE, JOIN_STEP, Position
from tether.controller.render.components import kubeadm, kubeadm_config
from tether.controller.render.shell import q
from tether.controller.render.steps import RenderInput, make_step
from tether.nodeagent.model import Step

# Filled in on the node, where the address is known (the agent exports TETHER_NODE_IP and TETHER_NODE).
ADVERTISE = "@ADVERTISE_ADDRESS@"
ENDPOINT = "@CONTROL_PLANE_ENDPOINT@"
NODE_NAME = "@NODE_NAME@"


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
        return [init_step(inp), *kubeadm.bootstrap_steps(inp)[1:2]]  # and Calico, once, from here
    return [join_step(inp)]
