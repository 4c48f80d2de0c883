"""Hypothetical nodes for offline rendering (``tetherctl env render --os ...``)."""

from __future__ import annotations

from tether.nodeagent.model import HostFacts

OS_PRESETS: dict[str, tuple[str, str, str, str]] = {
    # key: (os_id, version_id, family, pretty name)
    "ubuntu-22.04": ("ubuntu", "22.04", "debian", "Ubuntu 22.04 LTS"),
    "ubuntu-24.04": ("ubuntu", "24.04", "debian", "Ubuntu 24.04 LTS"),
    "debian-12": ("debian", "12", "debian", "Debian GNU/Linux 12 (bookworm)"),
    "rocky-9": ("rocky", "9", "rhel", "Rocky Linux 9"),
    "fedora-42": ("fedora", "42", "rhel", "Fedora Linux 42"),
    "amazon-linux-2023": ("amzn", "2023", "amazon", "Amazon Linux 2023"),
}
DEFAULT_OS = "ubuntu-22.04"


def facts_for(os_key: str, *, gpu: bool = True, arch: str = "amd64") -> HostFacts:
    try:
        os_id, version, family, pretty = OS_PRESETS[os_key]
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
        python_version="3.11",
        systemd=True,
        nvidia_gpu=gpu,
    )
