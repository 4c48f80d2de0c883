"""What rendering knows about the target node, and what it derives from that.

``NodeContext`` is the whole input besides the spec: frozen and hashable, because the
controller caches plans by it. New inputs (cluster orchestration will add something like
``cluster: ClusterContext | None = None``) are added as fields with defaults, so existing
callers and caches keep working.
"""

from __future__ import annotations

from dataclasses import dataclass

from tether.controller.cluster.context import ClusterContext
from tether.controller.render.shell import Trusted
from tether.nodeagent.model import HostFacts

FAMILIES = ("debian", "rhel", "amazon")
ARCHES = {"amd64": "x86_64", "arm64": "aarch64"}


@dataclass(frozen=True)
class NodeContext:
    """Everything about the target node that rendering may depend on (and nothing else)."""

    role: str
    facts: HostFacts
    # The node's place in a kubeadm cluster (spec.cluster); None renders single-node Kubernetes.
    cluster: ClusterContext | None = None


@dataclass(frozen=True)
class Target:
    """The node as the templates see it: OS family, package manager, architecture, ids."""

    family: str
    arch: str
    os_id: str
    os_version: str

    @property
    def pm(self) -> str:
        return "apt" if self.family == "debian" else "dnf"

    @property
    def machine(self) -> str:
        """``uname -m`` spelling of the architecture."""
        return ARCHES[self.arch]

    @property
    def cuda_repo(self) -> str:
        """The CUDA repository directory for this OS, e.g. ``ubuntu2204/x86_64``."""
        arch = "sbsa" if self.arch == "arm64" and self.os_id != "amzn" else self.machine
        if self.family == "rhel" and self.os_id != "fedora":
            name = f"rhel{self.os_version.split('.')[0]}"
        else:
            name = f"{self.os_id}{self.os_version.replace('.', '')}"
        return f"{name}/{arch}"

    def context(self) -> dict[str, object]:
        return {
            "family": Trusted(self.family),
            "arch": Trusted(self.arch),
            "machine": Trusted(self.machine),
            "pm": self.pm,
            "os_id": self.os_id,
        }


def target_of(facts: HostFacts, arch_override: str = "") -> tuple[Target | None, str]:
    """The target for these facts, or ``None`` and the reason tether cannot provision it."""
    arch = facts.arch or arch_override
    if facts.os_family not in FAMILIES:
        name = facts.os_pretty or facts.os_id or "unknown"
        supported = "Debian/Ubuntu, RHEL/Rocky/Fedora and Amazon Linux"
        return None, f"unsupported OS {name}: tether supports {supported}"
    if arch not in ARCHES:
        return None, f"unsupported architecture {arch or 'unknown'} (amd64 or arm64)"
    return Target(facts.os_family, arch, facts.os_id, facts.os_version_id), ""
