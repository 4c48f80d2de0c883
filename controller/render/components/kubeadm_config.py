"""The kubeadm configuration tether generates (or the user's, with holodeck's four Go-template
placeholders filled in), as YAML text.

It reaches the node through the step's environment, never through script text, so no value
in it is ever parsed by a shell.
"""

from __future__ import annotations

from typing import Any

import yaml

from tether.controller.render.steps import RenderInput
from tether.controller.spec import checks, defaults, kubeadm_template

CRI_SOCKETS = {
    "containerd": "unix:///run/containerd/containerd.sock",
    "crio": "unix:///var/run/crio/crio.sock",
    "docker": "unix:///run/cri-dockerd.sock",
}
VERSION_PLACEHOLDER = "@KUBERNETES_VERSION@"
NODE_ADDRESS = "@ADVERTISE_ADDRESS@"  # the node's address; the init scripts fill it in (cluster.ADVERTISE)


def cri_socket(inp: RenderInput) -> str:
    return CRI_SOCKETS[inp.spec.runtime.name]


def api_version(version: str) -> str:
    """v1beta4 from Kubernetes 1.31 on (and for source builds), v1beta3 before."""
    m = checks.SEMVER_RE.fullmatch(version)
    if m and (int(m.group(1)), int(m.group(2))) < (1, 31):
        return "kubeadm.k8s.io/v1beta3"
    return "kubeadm.k8s.io/v1beta4"


def _args(api: str, args: dict[str, str]) -> Any:
    if api.endswith("v1beta3"):
        return dict(args)
    return [{"name": k, "value": v} for k, v in args.items()]


def generate(inp: RenderInput) -> str:
    k8s = inp.spec.kubernetes
    version = k8s.version if k8s.source == "release" else VERSION_PLACEHOLDER
    api = api_version(version)
    init: dict[str, Any] = {
        "apiVersion": api,
        "kind": "InitConfiguration",
        "nodeRegistration": {"criSocket": cri_socket(inp)},
    }
    cluster: dict[str, Any] = {
        "apiVersion": api,
        "kind": "ClusterConfiguration",
        "clusterName": inp.spec.dns_name,  # a DNS label (metadata.name may not be one)
        "kubernetesVersion": version,
        "networking": {"podSubnet": defaults.POD_SUBNET},
    }
    if k8s.endpoint_host:
        cluster["controlPlaneEndpoint"] = f"{k8s.endpoint_host}:6443"
        cluster["apiServer"] = {"certSANs": [k8s.endpoint_host]}
    kubelet: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "systemd",
    }
    if k8s.feature_gates:
        gates = ",".join(k8s.feature_gates)
        api_args = {"feature-gates": gates, "runtime-config": "resource.k8s.io/v1beta1=true"}
        cluster.setdefault("apiServer", {})["extraArgs"] = _args(api, api_args)
        cluster["controllerManager"] = {"extraArgs": _args(api, {"feature-gates": gates})}
        cluster["scheduler"] = {"extraArgs": _args(api, {"feature-gates": gates})}
        kubelet["featureGates"] = {g.split("=")[0]: g.endswith("=true") for g in k8s.feature_gates}
    return yaml.safe_dump_all([init, cluster, kubelet], sort_keys=False)


def control_plane_endpoint(inp: RenderInput) -> str:
    """The endpoint (host:port) tether's own configuration uses: the HA endpoint (a load
    balancer's, or each node's local one), else the init node's address (``NODE_ADDRESS``, filled
    in on the node by the init step) and the API port."""
    cluster = inp.node.cluster
    if cluster is not None and cluster.ha_endpoint:
        return cluster.ha_endpoint
    return f"{NODE_ADDRESS}:6443"


def config_text(inp: RenderInput) -> tuple[str, str]:
    """(the config, "user" or "generated"). The user's has holodeck's four Go-template
    placeholders filled in (``spec.kubeadm_template``; ``{{ .ControlPlaneEndpoint }}:6443`` is
    the whole endpoint, its port included); nothing else in it changes."""
    k8s = inp.spec.kubernetes
    if k8s.kubeadm_config:
        endpoint = control_plane_endpoint(inp)
        values = {
            "CriSocket": cri_socket(inp),
            "ClusterName": inp.spec.dns_name,
            "KubernetesVersion": k8s.version if k8s.source == "release" else VERSION_PLACEHOLDER,
            "ControlPlaneEndpoint": endpoint.rsplit(":", 1)[0],  # holodeck's: a host
        }
        return kubeadm_template.expand(k8s.kubeadm_config, values, endpoint=endpoint), "user"
    return generate(inp), "generated"
