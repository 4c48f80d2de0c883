"""containerd from Docker's repository (the distribution's on Amazon Linux), from git, or from
the tip of a branch; configured for Kubernetes (systemd cgroups, pause image, CNI dirs)."""

from __future__ import annotations

from tether.controller.render.components import runtime_common
from tether.controller.render.shell import q
from tether.controller.render.steps import RenderInput, make_step
from tether.controller.spec import defaults
from tether.nodeagent.model import Step


def package(inp: RenderInput) -> tuple[str, str]:
    """(package name, version pin) for the package source on this node."""
    rt = inp.spec.runtime
    native = inp.target.family == "amazon"
    name = rt.package_name or ("containerd" if native else "containerd.io")
    version = rt.version
    if not version and not native and not inp.repositories and not rt.package_name:
        version = defaults.CONTAINERD_VERSION
    return name, version


def steps(inp: RenderInput) -> list[Step]:
    rt = inp.spec.runtime
    name, version = package(inp)
    if rt.source == "package":
        requested = {"source": "package", "package": name, "version": version or "newest"}
    else:
        requested = runtime_common.git_requested(rt.source, rt.git)
    context = {
        "source": rt.source,
        "package": q(name),
        "version": q(version),
        "pause_image": q(defaults.PAUSE_IMAGE),
        **runtime_common.docker_repo(inp),
        **runtime_common.git_context(rt.git),
        **runtime_common.build_deps(inp),
    }
    return [
        make_step(
            inp,
            name="containerd",
            component="containerd",
            phase="runtime",
            template="containerd.j2",
            timeout=3600 if rt.source != "package" else 1200,
            requested=requested,
            description=f"containerd from {rt.source}, configured for Kubernetes",
            context=context,
        )
    ]
