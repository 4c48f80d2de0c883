"""The local apt repository served to the nodes: real Debian debs plus the stand-in packages, signed.

Stand-ins: the Kubernetes packages (``packages``) and a test-fixture kernel with its boot chain
(``kernelpkgs``).

A flat repository (``deb URL ./``) signed with a throwaway ed25519 key made per testbed. The key is
served armored at ``Release.key`` (like pkgs.k8s.io, for ``gpg --dearmor``) and binary at
``tether-testbed.gpg`` (ready for ``signed-by=``).
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import shutil
import subprocess
from pathlib import Path

from tests.e2e.testbed import kernelpkgs, packages

KEYRING_PATH = "/etc/apt/keyrings/tether-testbed.gpg"
KEY_UID = "tether testbed apt repo (TEST ONLY) <testbed@tether.invalid>"


@dataclasses.dataclass(frozen=True)
class Repo:
    dir: Path
    packages: list[str]


def build(www: Path, debian_debs: Path, gnupg: Path) -> Repo:
    apt = www / "apt"
    apt.mkdir(parents=True, exist_ok=True)
    for deb in sorted(debian_debs.glob("*.deb")):
        _link(deb, apt / deb.name)
    standins = packages.build_all(apt) + kernelpkgs.build_all(apt)
    _run(["apt-ftparchive", "packages", "."], cwd=apt, out=apt / "Packages")
    (apt / "Packages.gz").write_bytes(gzip.compress((apt / "Packages").read_bytes(), mtime=0))
    _run(
        [
            "apt-ftparchive",
            "-o",
            "APT::FTPArchive::Release::Origin=tether-testbed",
            "-o",
            "APT::FTPArchive::Release::Label=tether testbed local repo (TEST ONLY)",
            "-o",
            "APT::FTPArchive::Release::Suite=testbed",
            "-o",
            "APT::FTPArchive::Release::Codename=testbed",
            "-o",
            "APT::FTPArchive::Release::Architectures=amd64 all",
            "release",
            ".",
        ],
        cwd=apt,
        out=apt / "Release.tmp",
    )
    (apt / "Release.tmp").rename(apt / "Release")
    _sign(apt, gnupg)
    names = sorted({d.name.split("_")[0] for d in apt.glob("*.deb")})
    assert {p.name.split("_")[0] for p in standins} <= set(names)
    return Repo(apt, names)


def _sign(apt: Path, gnupg: Path) -> None:
    gnupg.mkdir(mode=0o700, parents=True, exist_ok=True)
    gpg = [
        "gpg",
        "--homedir",
        str(gnupg),
        "--batch",
        "--yes",
        "--pinentry-mode",
        "loopback",
        "--passphrase",
        "",
    ]
    try:
        _run([*gpg, "--quick-gen-key", KEY_UID, "ed25519", "sign", "never"])
        _run([*gpg, "--armor", "--export", KEY_UID], out=apt / "Release.key")
        _run([*gpg, "--export", KEY_UID], out=apt / "tether-testbed.gpg")
        _run([*gpg, "--clearsign", "-o", str(apt / "InRelease"), str(apt / "Release")])
        _run([*gpg, "-abs", "-o", str(apt / "Release.gpg"), str(apt / "Release")])
    finally:  # gpg starts an agent; it must not outlive the build
        subprocess.run(
            ["gpgconf", "--homedir", str(gnupg), "--kill", "all"], capture_output=True, check=False
        )


def _link(src: Path, dst: Path) -> None:
    if dst.exists():
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _run(argv: list[str], cwd: Path | None = None, out: Path | None = None) -> None:
    result = subprocess.run(argv, cwd=cwd, capture_output=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} failed: {result.stderr.decode(errors='replace')}")
    if out is not None:
        out.write_bytes(result.stdout)
