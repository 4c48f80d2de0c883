"""Every file tether downloads from upstream, and how its integrity is checked.

A ``Download`` names the upstream URL (the node rewrites it onto ``spec.downloadMirror``) and
its check: a pinned sha256, ``published:URL`` (the checksum file upstream publishes next to the
artifact, fetched through the same mirror), or ``unpublished`` (upstream publishes none: the
node records the sha256 of what it fetched as provenance). Pin a sha256 in ``PINNED`` to make
a default artifact independent of the mirror's honesty.
"""

from __future__ import annotations

from dataclasses import dataclass

# upstream URL -> sha256 of the artifact. Only values verified against upstream belong here.
PINNED: dict[str, str] = {}

# Repository signing keys whose fingerprints upstream documents.
DOCKER_KEY_FINGERPRINT = "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"
CUDA_KEY_FINGERPRINT = "EB693B3035CD5710E231E123A4B469963BF863CC"


@dataclass(frozen=True)
class Download:
    url: str
    check: str

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]


def _published(url: str, checksum_url: str) -> Download:
    return Download(url, PINNED.get(url, f"published:{checksum_url}"))


def cni_plugins(version: str, arch: str) -> Download:
    url = (
        "https://github.com/containernetworking/plugins/releases/download/"
        f"{version}/cni-plugins-linux-{arch}-{version}.tgz"
    )
    return _published(url, url + ".sha256")


def crictl(version: str, arch: str) -> Download:
    url = f"https://github.com/kubernetes-sigs/cri-tools/releases/download/{version}/crictl-{version}-linux-{arch}.tar.gz"
    return _published(url, url + ".sha256")


def runc(version: str, arch: str) -> Download:
    base = f"https://github.com/opencontainers/runc/releases/download/{version}"
    return _published(f"{base}/runc.{arch}", f"{base}/runc.sha256sum")


def kind(version: str, arch: str) -> Download:
    url = f"https://github.com/kubernetes-sigs/kind/releases/download/{version}/kind-linux-{arch}"
    return _published(url, url + ".sha256sum")


def kubectl(version: str, arch: str) -> Download:
    url = f"https://dl.k8s.io/release/{version}/bin/linux/{arch}/kubectl"
    return _published(url, url + ".sha256")


def cri_dockerd(version: str, arch: str) -> Download:
    url = f"https://github.com/Mirantis/cri-dockerd/releases/download/v{version}/cri-dockerd-{version}.{arch}.tgz"
    return Download(url, PINNED.get(url, "unpublished"))


def calico_manifest(version: str, name: str) -> Download:
    url = f"https://raw.githubusercontent.com/projectcalico/calico/{version}/manifests/{name}"
    return Download(url, PINNED.get(url, "unpublished"))
