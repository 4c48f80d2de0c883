"""Stand-in Kubernetes packages (TEST FIXTURES ONLY): kubeadm, kubelet, kubectl, kubernetes-cni, cri-tools.

Named like the packages of the Kubernetes package repository (pkgs.k8s.io) so install scripts are the
same, but every file is the ``k8s_standin`` zipapp (stdlib Python for the node's python3) or a stub, and
every package says so in its description. Built with ``dpkg-deb`` into the local apt repo on ``up``.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import zipapp
from pathlib import Path

from tests.e2e.testbed.standins.k8s_standin import VERSION

STANDINS = Path(__file__).parent / "standins"
K8S_VERSION = VERSION  # e.g. v1.31.4
DEB_VERSION = f"{VERSION.lstrip('v')}-1.1"
CRI_TOOLS_VERSION = "1.31.1-1.1"
CNI_VERSION = "1.5.1-1.1"
MAINTAINER = "tether e2e testbed <testbed@tether.invalid>"
FIXTURE = "TEST FIXTURE ONLY - tether e2e testbed stand-in, not Kubernetes; never ship"

KUBELET_UNIT = """\
# TEST FIXTURE ONLY (tether e2e testbed): the kubelet stand-in, laid out like the kubelet package's unit.
[Unit]
Description=kubelet: The Kubernetes Node Agent (tether test fixture stand-in)
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=3

[Install]
WantedBy=multi-user.target
"""

KUBEADM_DROPIN = """\
# TEST FIXTURE ONLY (tether e2e testbed): same as the kubeadm drop-in of the real kubelet package.
[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf \
--kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS \
$KUBELET_EXTRA_ARGS
"""

KUBELET_POSTINST = """\
#!/bin/sh
# TEST FIXTURE ONLY: enable the kubelet stand-in (it crash-loops until kubeadm init/join configures it).
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
  systemctl enable kubelet.service >/dev/null 2>&1 || true
  systemctl restart kubelet.service || true
fi
"""

KUBELET_PRERM = """\
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
  systemctl disable --now kubelet.service >/dev/null 2>&1 || true
fi
"""

CNI_STUB = """\
#!/bin/sh
# TEST FIXTURE ONLY (tether e2e testbed): stand-in CNI plugin, does nothing.
echo '{"cniVersion":"1.0.0","code":100,"msg":"tether test fixture: stand-in CNI plugin"}'
exit 1
"""


def build_zipapp(target: Path) -> None:
    """One executable zipapp holding every stand-in; it dispatches on the name it runs as."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(
            STANDINS / "k8s_standin", src / "k8s_standin", ignore=shutil.ignore_patterns("__pycache__")
        )
        zipapp.create_archive(src, target, interpreter="/usr/bin/python3", main="k8s_standin.__main__:run")
    target.chmod(0o755)


def build_all(out: Path) -> list[Path]:
    """Build the five .debs into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        app = work / "k8s-standin.pyz"
        build_zipapp(app)
        specs: list[tuple[str, str, str, dict[str, str | Path], dict[str, str]]] = [
            (
                "kubeadm",
                DEB_VERSION,
                "cri-tools (>= 1.30.0), python3, openssl, iproute2",
                {
                    "usr/bin/kubeadm": app,
                    "usr/bin/kubeadm-standin": app,
                    "usr/lib/kubeadm-standin/kube-apiserver-standin": app,
                },
                {},
            ),
            (
                "kubelet",
                DEB_VERSION,
                "kubernetes-cni (>= 1.4.0), iptables, python3, iproute2",
                {
                    "usr/bin/kubelet": app,
                    "usr/lib/systemd/system/kubelet.service": KUBELET_UNIT,
                    "usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf": KUBEADM_DROPIN,
                },
                {"postinst": KUBELET_POSTINST, "prerm": KUBELET_PRERM},
            ),
            ("kubectl", DEB_VERSION, "python3", {"usr/bin/kubectl": app}, {}),
            ("cri-tools", CRI_TOOLS_VERSION, "python3", {"usr/bin/crictl": app}, {}),
            (
                "kubernetes-cni",
                CNI_VERSION,
                "",
                {f"opt/cni/bin/{p}": CNI_STUB for p in ("bridge", "host-local", "loopback", "portmap")},
                {},
            ),
        ]
        return [_deb(work, out, *spec) for spec in specs]


def _deb(
    work: Path,
    out: Path,
    name: str,
    version: str,
    depends: str,
    files: dict[str, str | Path],
    scripts: dict[str, str],
    *,
    summary: str = "",
    fields: dict[str, str] | None = None,
) -> Path:
    """One .deb of TEST FIXTURE files; ``summary`` replaces the Kubernetes description line, ``fields``
    adds control fields (Provides, Conflicts, ...)."""
    root = work / name
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copyfile(content, path)
            path.chmod(0o755)
        else:
            path.write_text(content)
            path.chmod(0o755 if content.startswith("#!") else 0o644)
    doc = root / f"usr/share/doc/{name}/README.tether-test-fixture"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(f"{name} {version}: {FIXTURE}.\nBuilt by tests/e2e/testbed/packages.py.\n")
    (root / "DEBIAN").mkdir()
    control = [
        f"Package: {name}",
        f"Version: {version}",
        "Architecture: amd64",
        f"Maintainer: {MAINTAINER}",
        *([f"Depends: {depends}"] if depends else []),
        *(f"{key}: {value}" for key, value in (fields or {}).items()),
        "Section: admin",
        "Priority: optional",
        f"Description: {FIXTURE}",
        f" {summary or f'Stand-in for the Kubernetes {name!r} package'}, used only by tether's e2e tests.",
    ]
    (root / "DEBIAN/control").write_text("\n".join(control) + "\n")
    for script, text in scripts.items():
        (root / "DEBIAN" / script).write_text(text)
        (root / "DEBIAN" / script).chmod(0o755)
    target = out / f"{name}_{version}_amd64.deb"
    subprocess.run(
        ["dpkg-deb", "-Zgzip", "--root-owner-group", "--build", str(root), str(target)],
        check=True,
        capture_output=True,
    )
    return target
