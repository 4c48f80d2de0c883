"""NVIDIA Container Toolkit from its repository (channel, version), or built from git / a
branch tip; then ``nvidia-ctk runtime configure`` for the runtime, and CDI when asked."""

from __future__ import annotations

from tether.controller.render.components import runtime_common
from tether.controller.render.shell import q
from tether.controller.render.steps import RenderInput, make_step
from tether.nodeagent.model import Step

REPO = "https://nvidia.github.io/libnvidia-container"


def runtime_name(inp: RenderInput) -> str:
    k8s = inp.spec.kubernetes
    if k8s.install and k8s.installer == "kind":
        return "docker"
    return inp.spec.runtime.name


def steps(inp: RenderInput) -> list[Step]:
    tk = inp.spec.toolkit
    if not tk.install:
        return []
    apt = inp.target.pm == "apt"
    if tk.source == "package":
        requested = {"source": "package", "channel": tk.channel, "version": tk.version or "newest"}
    else:
        requested = runtime_common.git_requested(tk.source, tk.git)
    runtime = runtime_name(inp)
    requested["runtime"] = runtime
    requested["cdi"] = "true" if tk.enable_cdi else "false"
    context = {
        "source": tk.source,
        "version": q(tk.version),
        "key_url": q(f"{REPO}/gpgkey"),
        "repo_url": q(
            f"{REPO}/{tk.channel}/deb/{inp.target.arch}" if apt else f"{REPO}/{tk.channel}/rpm/$basearch"
        ),
        "runtime": q(runtime),
        "runtime_config": q(
            {
                "containerd": "/etc/containerd/config.toml",
                "docker": "/etc/docker/daemon.json",
                "crio": "/etc/crio/crio.conf.d/99-nvidia.toml",
            }[runtime]
        ),
        "cdi": inp.spec.toolkit.enable_cdi,
        **runtime_common.git_context(tk.git),
    }
    return [
        make_step(
            inp,
            name="nvidia-container-toolkit",
            component="nvidia-container-toolkit",
            phase="toolkit",
            template="toolkit.j2",
            timeout=2400 if tk.source != "package" else 900,
            requested=requested,
            description=f"NVIDIA Container Toolkit from {tk.source}, configured for {runtime}",
            context=context,
        )
    ]
