"""A tiny OCI image archive built locally (no registry is reachable): busybox-static as /bin/sh.

``ctr images import`` takes it under the name in the ``io.containerd.image.name`` annotation.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

IMAGE_REF = "docker.io/library/busybox-standin:1.35"
APPLETS = ("sh", "echo", "cat", "ls", "hostname", "sleep", "id", "uname", "true", "false", "env", "ps")


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.mtime = 0
            info.uid = info.gid = 0
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def build(target: Path, busybox: Path | None = None) -> str:
    """Write the OCI archive to ``target``; returns the image reference it imports as."""
    found = busybox or Path(shutil.which("busybox") or "/bin/busybox")
    binary = found.read_bytes()
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    for name, mode in (("bin", 0o755), ("tmp", 0o1777), ("etc", 0o755)):
        info = tarfile.TarInfo(name)
        info.type, info.mode = tarfile.DIRTYPE, mode
        members.append((info, None))
    info = tarfile.TarInfo("bin/busybox")
    info.size, info.mode = len(binary), 0o755
    members.append((info, binary))
    for applet in APPLETS:
        link = tarfile.TarInfo(f"bin/{applet}")
        link.type, link.linkname = tarfile.SYMTYPE, "busybox"
        members.append((link, None))
    layer_digest, layer = _blob(_tar(members))
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"], "Labels": {"tether.test/fixture": "true"}},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }
    config_digest, config_blob = _blob(json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": len(config_blob),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": len(layer),
            }
        ],
    }
    manifest_digest, manifest_blob = _blob(json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": len(manifest_blob),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": IMAGE_REF,
                    "org.opencontainers.image.ref.name": "1.35",
                },
            }
        ],
    }
    files: list[tuple[tarfile.TarInfo, bytes | None]] = []
    for name, data in (
        ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
        ("index.json", json.dumps(index, sort_keys=True).encode()),
        *(
            (f"blobs/sha256/{d.split(':')[1]}", b)
            for d, b in (
                (layer_digest, layer),
                (config_digest, config_blob),
                (manifest_digest, manifest_blob),
            )
        ),
    ):
        entry = tarfile.TarInfo(name)
        entry.size, entry.mode = len(data), 0o644
        files.append((entry, data))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(_tar(files))
    return IMAGE_REF
