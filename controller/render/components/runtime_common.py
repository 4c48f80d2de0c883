"""What the runtime templates share: Docker's repositories, git build inputs, CNI and runc."""

from __future__ import annotations

from typing import Any

from tether.controller.render import downloads
from tether.controller.render.shell import q
from tether.controller.render.steps import RenderInput
from tether.controller.spec import defaults
from tether.controller.spec.model import GitSource

DOCKER = "https://download.docker.com/linux"


def docker_repo(inp: RenderInput) -> dict[str, Any]:
    """Context for ``docker_repo.j2`` (Docker's apt/dnf repository for this OS)."""
    os_id = inp.target.os_id
    if inp.target.pm == "apt":
        distro = "ubuntu" if os_id == "ubuntu" else "debian"
        return {
            "docker_key_url": q(f"{DOCKER}/{distro}/gpg"),
            "docker_key_fingerprint": q(downloads.DOCKER_KEY_FINGERPRINT),
            "docker_repo_url": q(f"{DOCKER}/{distro}"),
        }
    distro = "fedora" if os_id == "fedora" else "centos"
    return {
        "docker_key_url": q(f"{DOCKER}/{distro}/gpg"),
        "docker_key_fingerprint": q(""),
        "docker_repo_url": q(f"{DOCKER}/{distro}/$releasever/$basearch/stable"),
    }


def git_context(git: GitSource | None) -> dict[str, Any]:
    return {"git_repo": q(git.repo if git else ""), "git_ref": q(git.ref if git else "")}


def git_requested(source: str, git: GitSource | None) -> dict[str, str]:
    if git is None:
        return {"source": source}
    key = "track" if source == "latest" else "ref"
    return {"source": source, "repo": git.repo, key: git.ref}


def build_deps(inp: RenderInput) -> dict[str, Any]:
    """CNI plugins and runc for runtimes built from source (checksums published upstream)."""
    arch = inp.target.arch
    cni = downloads.cni_plugins(defaults.CNI_PLUGINS_VERSION, arch)
    runc = downloads.runc(defaults.RUNC_VERSION, arch)
    return {
        "cni_url": q(cni.url),
        "cni_check": q(cni.check),
        "runc_url": q(runc.url),
        "runc_check": q(runc.check),
    }
