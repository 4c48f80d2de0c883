"""Kubernetes in docker with kind: the release's node image (holodeck ignored the version), or a
node image built from git / a branch tip; GPU-aware when the toolkit is there."""

from __future__ import annotations

from tether.controller.render import downloads
from tether.controller.render.components import runtime_common
from tether.controller.render.shell import q
from tether.controller.render.steps import RenderInput, make_step
from tether.controller.spec import defaults
from tether.nodeagent.model import Step


def steps(inp: RenderInput) -> list[Step]:
    k8s = inp.spec.kubernetes
    arch = inp.target.arch
    kind_version = k8s.kind_version or defaults.KIND_VERSION
    kind = downloads.kind(kind_version, arch)
    kubectl_version = k8s.version if k8s.source == "release" else defaults.KUBERNETES_VERSION
    kubectl = downloads.kubectl(kubectl_version, arch)
    if k8s.source == "release":
        requested = {"source": "release", "version": k8s.version, "kind": kind_version}
    else:
        requested = {**runtime_common.git_requested(k8s.source, k8s.git), "kind": kind_version}
    env = {"TETHER_KIND_CONFIG": k8s.kind_config} if k8s.kind_config else {}
    context = {
        "source": k8s.source,
        "kind_version": q(kind_version),
        "kind_url": q(kind.url),
        "kind_check": q(kind.check),
        "kubectl_version": q(kubectl_version),
        "kubectl_url": q(kubectl.url),
        "kubectl_check": q(kubectl.check),
        "node_image": q(f"kindest/node:{k8s.version}"),
        "user_config": bool(k8s.kind_config),
        "gpu": inp.gpu,
        **runtime_common.git_context(k8s.git),
    }
    return [
        make_step(
            inp,
            name="kind",
            component="kind",
            phase="kubernetes",
            template="kind.j2",
            timeout=5400 if k8s.source != "release" else 1800,
            requested=requested,
            description=f"a kind cluster from {k8s.source}",
            env=env,
            context=context,
        )
    ]
