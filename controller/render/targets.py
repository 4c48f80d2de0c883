"""Hypothetical nodes for offline rendering (``tetherctl env render --os ...``).

What differs between releases of one family is decided at render time from these facts (the CUDA
repository directory, e.g. ``ubuntu2604``) or on the node (Docker's repository takes the node's
``VERSION_CODENAME``); the package names tether installs by name (build tools, -dev packages,
conntrack/socat/iptables/ebtables/ethtool, kubeadm/kubelet/kubectl, NVIDIA's packages) are the
same on Ubuntu 22.04, 24.04 and 26.04: the 64-bit time_t renames of 24.04 (``libssl3t64`` ...)
touch only runtime libraries that come in as dependencies. ``python`` is the release's python3.
"""

from __future__ import annotations

from tether.nodeagent.model import HostFacts

OS_PRESETS: dict[str, tuple[str, str, str, str, str]] = {
    # key: (os_id, version_id, family, pretty name, python3)
    "ubuntu-22.04": ("ubuntu", "22.04", "debian", "Ubuntu 22.04 LTS", "3.10"),
    "ubuntu-24.04": ("ubuntu", "24.04", "debian", "Ubuntu 24.04 LTS", "3.12"),
    "ubuntu-26.04": ("ubuntu", "26.04", "debian", "Ubuntu 26.04 LTS", "3.14"),
    "debian-12": ("debian", "12", "debian", "Debian GNU/Linux 12 (bookworm)", "3.11"),
    "rocky-9": ("rocky", "9", "rhel", "Rocky Linux 9", "3.9"),
    "fedora-42": ("fedora", "42", "rhel", "Fedora Linux 42", "3.13"),
    "amazon-linux-2023": ("amzn", "2023", "amazon", "Amazon Linux 2023", "3.9"),
}
DEFAULT_OS = "ubuntu-22.04"


def facts_for(os_key: str, *, gpu: bool = True, arch: str = "amd64") -> HostFacts:
    try:
        os_id, version, family, pretty, python = OS_PRESETS[os_key]
    except KeyError:
        raise ValueError(f"unknown OS {os_key!r} (one of {', '.join(OS_PRESETS)})") from None
    return HostFacts(
        hostname="example-node",
        os_id=os_id,
        os_version_id=version,
        os_family=family,
        os_pretty=pretty,
        arch=arch,
        kernel="",
        python_version=python,
        systemd=True,
        nvidia_gpu=gpu,
    )
