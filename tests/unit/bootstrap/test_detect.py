"""Detection output parsing, refusals (all reasons at once) and the Python plan."""

from __future__ import annotations

import base64
import json

from tether.bootstrap import detect, prereqs
from tether.bootstrap.layout import DEFAULT_LAYOUT

OUTPUT = """\
uname_s=Linux
uname_m=aarch64
kernel=6.1.0-21-arm64
hostname=gpu-7
os_id=rocky
os_version_id=9.4
os_like=rhel centos fedora
os_pretty=Rocky Linux 9.4 (Blue Onyx)
systemd=1
systemctl=1
docker=1
gpu=0000:65:00.0
gpu=0000:66:00.0
python=/usr/bin/python3 3.9.18 glibc 2.34 ok
python=/usr/bin/python3.11 3.11.7 glibc 2.34 ok
python=/usr/libexec/platform-python
pkg=dnf
free_kb=52428800
machine_id=0123abcd
boot_id=b-1
unit_active=inactive
unit_enabled=disabled
"""


def test_parse_reads_every_fact() -> None:
    host = detect.parse(OUTPUT)
    f = host.facts
    assert (f.hostname, f.os_id, f.os_version_id, f.os_family, f.arch) == (
        "gpu-7",
        "rocky",
        "9.4",
        "rhel",
        "arm64",
    )
    assert f.systemd and f.docker and f.nvidia_gpu
    assert host.gpu_devices == ("0000:65:00.0", "0000:66:00.0")
    assert [p.path for p in host.pythons] == ["/usr/bin/python3", "/usr/bin/python3.11"]  # broken one skipped
    assert host.python is not None and host.python.path == "/usr/bin/python3.11"
    assert host.glibc == (2, 34)
    assert host.package_manager == "dnf"
    assert host.install.marker is None and not host.install.identity
    assert detect.refusals(host, python_installable=True) == []
    assert "Rocky Linux 9.4 (Blue Onyx), arm64" in host.summary()
    assert "NVIDIA GPU yes (2)" in host.summary()


def test_marker_and_identity_are_read() -> None:
    marker = {"state": "installed", "node_name": "gpu-7"}
    text = OUTPUT + "marker=" + base64.b64encode(json.dumps(marker).encode()).decode() + "\nidentity=1\n"
    host = detect.parse(text)
    assert host.install.marker == marker
    assert host.install.identity


def test_every_refusal_is_reported_at_once() -> None:
    text = (
        OUTPUT.replace("uname_m=aarch64", "uname_m=s390x")
        .replace("systemd=1\n", "")
        .replace("glibc 2.34", "musl 1.2")
        .replace("free_kb=52428800", "free_kb=1024")
    ) + "disabled=1\n"
    reasons = detect.refusals(detect.parse(text), python_installable=True)
    assert len(reasons) == 5
    joined = " | ".join(reasons)
    for phrase in ("s390x", "systemd is not running", "glibc >= 2.17", "1 MiB free", "/etc/tether/disabled"):
        assert phrase in joined


def test_the_script_is_read_only_and_looks_where_the_layout_says() -> None:
    script = detect.script(DEFAULT_LAYOUT)
    assert "/var/lib/tether/bootstrap.json" in script
    assert "/var/lib/tether/key.pem" in script
    for verb in (" rm ", " mv ", "mkdir", " > /", "systemctl start", "systemctl enable", "install -"):
        assert verb not in script


def test_python_plans_per_distribution() -> None:
    rocky = detect.parse(OUTPUT.replace("python=/usr/bin/python3.11 3.11.7 glibc 2.34 ok\n", ""))
    plan = prereqs.plan(rocky)
    assert plan.python is None
    assert plan.command == "dnf install -y -q python3.11"
    amazon = detect.parse(
        OUTPUT.replace("os_id=rocky", "os_id=amzn")
        .replace("os_version_id=9.4", "os_version_id=2023")
        .replace("python=/usr/bin/python3.11 3.11.7 glibc 2.34 ok\n", "")
    )
    assert prereqs.plan(amazon).package == "python3.11"
    focal = detect.parse(
        OUTPUT.replace("os_id=rocky", "os_id=ubuntu")
        .replace("os_version_id=9.4", "os_version_id=20.04")
        .replace("os_pretty=Rocky Linux 9.4 (Blue Onyx)", "os_pretty=Ubuntu 20.04.6 LTS")
        .replace("python=/usr/bin/python3.11 3.11.7 glibc 2.34 ok\n", "")
        .replace("pkg=dnf", "pkg=apt-get")
    )
    refused = prereqs.plan(focal)
    assert not refused.possible
    assert "Ubuntu 20.04.6 LTS has no Python >= 3.10" in refused.reason
    assert "Python 3.9.18" in refused.reason
    assert detect.refusals(focal, python_installable=False, python_reason=refused.reason) == [refused.reason]
