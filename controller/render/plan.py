"""``render(spec, node) -> Plan``: pure (no I/O, no clock), holodeck's order, tether's fixes.

Order (holodeck §2, with the microk8s list reset replaced by validation):

1. preflight (tether): OS, root, tools, cloud-init; package repositories when the spec has them
2. custom templates, phase pre-install
3. kernel pin (reboot, then verify)
4. NVIDIA driver (GPU nodes only)
5. container runtime (containerd | docker (+ cri-dockerd for kubeadm) | crio)
6. custom post-runtime
7. NVIDIA container toolkit (GPU nodes only)
8. custom post-toolkit
9. Kubernetes (kubeadm | kind | microk8s)
10. custom post-kubernetes
11. custom post-install

Custom templates keep their YAML order inside a phase and run only on the roles they name.
With ``spec.rollout.drain`` on a kubeadm cluster node, the disruptive part (kernel to toolkit,
and every step that reboots) runs between a gated ``drain`` and a gated ``uncordon`` step.
With ``spec.hardware`` the plan starts with the gated ``hardware-check`` and has
``hardware-verify`` (and ``gpu-diagnostics``) before its cluster join (``components.hardware``).
"""

from __future__ import annotations

from collections.abc import Callable

from tether.controller.render.components import (
    apiserver_lb,
    cluster,
    containerd,
    crio,
    custom,
    docker,
    drain,
    driver,
    hardware,
    kernel,
    kind,
    kubeadm,
    microk8s,
    preflight,
    repos,
    toolkit,
)
from tether.controller.render.context import NodeContext, target_of
from tether.controller.render.steps import RenderInput, unsupported
from tether.controller.spec.model import EnvironmentSpec
from tether.nodeagent.model import Plan, Step

Section = Callable[[RenderInput], list[Step]]


def _runtime(inp: RenderInput) -> list[Step]:
    if not inp.spec.runtime.install:
        return []
    runtimes: dict[str, Section] = {
        "containerd": containerd.steps,
        "docker": docker.steps,
        "crio": crio.steps,
    }
    return runtimes[inp.spec.runtime.name](inp)


def _kubernetes(inp: RenderInput) -> list[Step]:
    if not inp.spec.kubernetes.install:
        return []
    installers: dict[str, Section] = {
        # HA without an endpoint: the node's own API server load balancer, before init/join.
        "kubeadm": lambda i: kubeadm.steps(i) + apiserver_lb.steps(i) + cluster.steps(i),
        "kind": kind.steps,
        "microk8s": microk8s.steps,
    }
    return installers[inp.spec.kubernetes.installer](inp)


def _gpu_only(section: Section) -> Section:
    """Driver and toolkit are not rendered for nodes without an NVIDIA GPU."""
    return lambda inp: section(inp) if inp.gpu else []


SECTIONS: tuple[Section, ...] = (
    preflight.steps,
    repos.steps,
    custom.phase("pre-install"),
    kernel.steps,
    _gpu_only(driver.steps),
    _runtime,
    custom.phase("post-runtime"),
    _gpu_only(toolkit.steps),
    custom.phase("post-toolkit"),
    _kubernetes,
    custom.phase("post-kubernetes"),
    custom.phase("post-install"),
)


def render(spec: EnvironmentSpec, node: NodeContext) -> Plan:
    """The ordered plan for one node. Same inputs, same plan, byte for byte."""
    target, reason = target_of(node.facts, spec.kubernetes.arch)
    if target is None:
        return Plan.build([unsupported(reason)], environment=spec.name, role=node.role)
    node = cluster.single_node_default(spec, node)
    inp = RenderInput(spec=spec, node=node, target=target)
    steps: list[Step] = []
    for section in SECTIONS:
        steps.extend(section(inp))
    steps = hardware.wrap(inp, drain.wrap(inp, steps))
    return Plan.build(steps, environment=spec.name, role=node.role)
