"""The download mirror (``downloadMirror``): ``MIRROR/HOST/PATH`` with stand-in files and their checksums.

Holds what a kubeadm install path may still download instead of installing packages: Calico manifests,
the stand-in kubeadm/kubelet/kubectl binaries at dl.k8s.io paths (with dl.k8s.io's ``.sha256`` files),
the CNI plugins and crictl tarballs (with GitHub's ``.sha256`` files) and the kubelet unit files.
Every file is a TEST FIXTURE; ``SHA256SUMS`` at the top lists them all.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

from tests.e2e.testbed import packages

CALICO_VERSION = "v3.31.5"
CNI_PLUGINS_VERSION = "v1.6.2"
CRICTL_VERSION = "v1.31.1"
KREL_VERSION = "v0.16.2"

_HEADER = "# TEST FIXTURE ONLY: tether e2e testbed stand-in for {what}; not the real file.\n"


def _manifest(what: str, docs: list[tuple[str, str, str]]) -> bytes:
    """YAML documents (apiVersion, kind, name) a stand-in kubectl apply can record."""
    body = "".join(
        f"---\napiVersion: {api}\nkind: {kind}\nmetadata:\n  name: "
        f'{name}\n  labels:\n    tether.test/fixture: "true"\n'
        for api, kind, name in docs
    )
    return (_HEADER.format(what=what) + body).encode()


def _tarball(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
        for name, data in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o755, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def build(www: Path) -> dict[str, str]:
    """Write the mirror under ``www/mirror``; returns {HOST/PATH: sha256}."""
    root = www / "mirror"
    k8s = packages.K8S_VERSION
    app = root / "_zipapp"
    app.parent.mkdir(parents=True, exist_ok=True)
    packages.build_zipapp(app)
    standin = app.read_bytes()
    app.unlink()
    calico = f"raw.githubusercontent.com/projectcalico/calico/{CALICO_VERSION}/manifests"
    krel = f"raw.githubusercontent.com/kubernetes/release/{KREL_VERSION}/cmd/krel/templates/latest"
    cni = f"github.com/containernetworking/plugins/releases/download/{CNI_PLUGINS_VERSION}"
    crictl = f"github.com/kubernetes-sigs/cri-tools/releases/download/{CRICTL_VERSION}"
    files: dict[str, bytes] = {
        f"{calico}/tigera-operator.yaml": _manifest(
            f"Calico {CALICO_VERSION} tigera-operator.yaml",
            [("v1", "Namespace", "tigera-operator"), ("apps/v1", "Deployment", "tigera-operator")],
        ),
        f"{calico}/custom-resources.yaml": _manifest(
            f"Calico {CALICO_VERSION} custom-resources.yaml",
            [
                ("operator.tigera.io/v1", "Installation", "default"),
                ("operator.tigera.io/v1", "APIServer", "default"),
            ],
        ),
        f"{krel}/kubelet/kubelet.service": packages.KUBELET_UNIT.encode(),
        f"{krel}/kubeadm/10-kubeadm.conf": packages.KUBEADM_DROPIN.encode(),
        f"dl.k8s.io/release/stable-{k8s[1:].rsplit('.', 1)[0]}.txt": f"{k8s}\n".encode(),
        f"{cni}/cni-plugins-linux-amd64-{CNI_PLUGINS_VERSION}.tgz": _tarball(
            {f"./{p}": packages.CNI_STUB.encode() for p in ("bridge", "host-local", "loopback", "portmap")}
        ),
        f"{crictl}/crictl-{CRICTL_VERSION}-linux-amd64.tar.gz": _tarball({"crictl": standin}),
    }
    for tool in ("kubeadm", "kubelet", "kubectl"):
        files[f"dl.k8s.io/release/{k8s}/bin/linux/amd64/{tool}"] = standin
    sums: dict[str, str] = {}
    for rel, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        sums[rel] = digest
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if rel.startswith("dl.k8s.io/release/v"):
            (root / f"{rel}.sha256").write_text(digest)  # dl.k8s.io: the bare hex digest
        elif rel.startswith("github.com/"):
            (root / f"{rel}.sha256").write_text(
                f"{digest}  {Path(rel).name}\n"
            )  # GitHub releases: sha256sum format
    (root / "SHA256SUMS").write_text("".join(f"{d}  {r}\n" for r, d in sorted(sums.items())))
    return sums
