"""Kubernetes with kubeadm: packages from pkgs.k8s.io (release) or a source build (git, latest)
on every node. Init and joins belong to cluster orchestration (``components.cluster``), with or
without ``spec.cluster`` (a single node is a cluster of one); Calico and the single node's
readiness step are rendered from here for it.
"""

from __future__ import annotations

from tether.controller.render import downloads
from tether.controller.render.components import kubeadm_config, runtime_common
from tether.controller.render.shell import q
from tether.controller.render.steps import RenderInput, make_step
from tether.controller.spec import checks, defaults
from tether.nodeagent.model import Step

PKGS = "https://pkgs.k8s.io/core:/stable:"


def _minor(version: str) -> str:
    m = checks.SEMVER_RE.fullmatch(version)
    return f"v{m.group(1)}.{m.group(2)}" if m else version


def install_step(inp: RenderInput) -> Step:
    k8s = inp.spec.kubernetes
    apt = inp.target.pm == "apt"
    base = f"{PKGS}/{_minor(k8s.version)}/{'deb' if apt else 'rpm'}/"
    arch = inp.target.arch
    cni = downloads.cni_plugins(k8s.cni_plugins_version or defaults.CNI_PLUGINS_VERSION, arch)
    crictl = downloads.crictl(k8s.crictl_version or defaults.CRICTL_VERSION, arch)
    if k8s.source == "release":
        requested = {"source": "release", "version": k8s.version}
    else:
        requested = runtime_common.git_requested(k8s.source, k8s.git)
    context = {
        "source": k8s.source,
        "version": q(k8s.version.removeprefix("v")),
        "cni_version": q(k8s.cni_plugins_version.removeprefix("v")),
        "crictl_version": q(k8s.crictl_version.removeprefix("v")),
        "repo_url": q(base),
        "key_url": q(base + ("Release.key" if apt else "repodata/repomd.xml.key")),
        "cri_socket": q(kubeadm_config.cri_socket(inp)),
        "cni_url": q(cni.url),
        "cni_check": q(cni.check),
        "crictl_url": q(crictl.url),
        "crictl_check": q(crictl.check),
        **runtime_common.git_context(k8s.git),
    }
    return make_step(
        inp,
        name="kubeadm",
        component="kubernetes",
        phase="kubernetes",
        template="kubeadm.j2",
        timeout=5400 if k8s.source != "release" else 1200,
        requested=requested,
        description=f"kubeadm, kubelet and kubectl from {k8s.source}; node prerequisites",
        context=context,
    )


def calico_step(inp: RenderInput) -> Step:
    """Calico, once, from the init node (``components.cluster``)."""
    k8s = inp.spec.kubernetes
    calico_version = k8s.calico_version or defaults.CALICO_VERSION
    operator = downloads.calico_manifest(calico_version, "tigera-operator.yaml")
    resources = downloads.calico_manifest(calico_version, "custom-resources.yaml")
    return make_step(
        inp,
        name="calico",
        component="calico",
        phase="kubernetes",
        template="calico.j2",
        timeout=1800,
        requested={"version": calico_version},
        description="Calico through the tigera operator (host network until the CNI is up)",
        context={
            "version": q(calico_version),
            "operator_url": q(operator.url),
            "operator_check": q(operator.check),
            "resources_url": q(resources.url),
            "resources_check": q(resources.check),
        },
    )


def ready_step(inp: RenderInput) -> Step:
    """holodeck's last single-node step: untaint and label the node, wait for it and for CoreDNS."""
    return make_step(
        inp,
        name="kubernetes-ready",
        component="kubernetes",
        phase="kubernetes",
        template="kubernetes_ready.j2",
        timeout=900,
        requested={"labels": "node-role.kubernetes.io/worker, tether.dev/managed"},
        description="untaints and labels the node, waits for it and for CoreDNS",
    )


def steps(inp: RenderInput) -> list[Step]:
    return [install_step(inp)]
