"""The first step of every plan: right OS, root, tools present, cloud-init finished."""

from __future__ import annotations

from tether.controller.render.shell import q
from tether.controller.render.steps import RenderInput, make_step
from tether.nodeagent.model import Step


def blockers(inp: RenderInput) -> list[str]:
    """What this node cannot do for this spec, known before anything is installed."""
    k8s = inp.spec.kubernetes
    out = []
    if k8s.install and k8s.installer == "microk8s" and inp.target.family == "amazon":
        out.append("microk8s needs snapd, which Amazon Linux does not ship")
    return out


def needs_root(inp: RenderInput) -> bool:
    """Whether the plan changes the system (packages, kernel, services) or only runs the user's scripts."""
    spec = inp.spec
    return bool(
        spec.kernel is not None
        or spec.driver.install
        or spec.runtime.install
        or spec.toolkit.install
        or spec.kubernetes.install
        or spec.package_repositories.apt
        or spec.package_repositories.dnf
        or any(t.url for t in spec.custom_templates)
    )


def steps(inp: RenderInput) -> list[Step]:
    pm_tools = ["curl", "ca-certificates", "gnupg"] if inp.target.pm == "apt" else ["curl", "gnupg2"]
    return [
        make_step(
            inp,
            name="preflight",
            component="tether",
            phase="pre-install",
            template="preflight.j2",
            timeout=900,
            requested={"os": inp.node.facts.os_key, "arch": inp.target.arch},
            description="checks the node can run this plan; waits for cloud-init",
            context={
                "blockers": [q(b) for b in blockers(inp)],
                "tools": q(pm_tools),
                "system": needs_root(inp),
            },
        )
    ]
