"""Kubernetes with microk8s from the snap store, on the release's track.

holodeck dropped every other component when microk8s was chosen; tether keeps the kernel,
driver and custom templates, and validation rejects the container runtime and the toolkit
(microk8s brings its own containerd; its gpu add-on installs the toolkit into it).
"""

from __future__ import annotations

from tether.controller.render.shell import q
from tether.controller.render.steps import RenderInput, make_step
from tether.controller.spec import checks
from tether.nodeagent.model import Step

ADDONS = ("dns", "dashboard", "registry")


def channel(version: str) -> str:
    m = checks.SEMVER_RE.fullmatch(version)
    return f"{m.group(1)}.{m.group(2)}/stable" if m else "stable"


def steps(inp: RenderInput) -> list[Step]:
    k8s = inp.spec.kubernetes
    addons = [*ADDONS, "gpu"] if inp.gpu else list(ADDONS)
    return [
        make_step(
            inp,
            name="microk8s",
            component="microk8s",
            phase="kubernetes",
            template="microk8s.j2",
            timeout=1800,
            requested={"source": "snap", "channel": channel(k8s.version), "addons": " ".join(addons)},
            description="microk8s from the snap store with its add-ons",
            context={"channel": q(channel(k8s.version)), "addons": q(addons)},
        )
    ]
