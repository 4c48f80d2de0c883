"""The node root filesystem, built with debootstrap once and cached on the machine by a hash of its recipe.

Two cache levels under ``CACHE`` (default /var/cache/tether-testbed, env TETHER_TESTBED_CACHE):

- ``base-<hash>/``: the debootstrap tree plus ``debs/``, the real Debian packages (containerd, runc, ...)
  that the rootfs lacks, for the local apt repo. Slow (~1.5-2 min, network), so it is keyed only by what
  debootstrap and apt download.
- ``node-<hash>/rootfs``: a copy of the base with the node prep (units, sshd drop-in, test user). Cheap
  (seconds), keyed by the whole recipe. Nodes share it read-only under ``--volatile=overlay``.

Builds run under an exclusive lock, so concurrent test runs build once; progress goes to stderr.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.e2e.testbed import log

CACHE_ENV = "TETHER_TESTBED_CACHE"
DEFAULT_CACHE = Path("/var/cache/tether-testbed")
NSPAWN_PROPAGATE = Path("/run/systemd/nspawn/propagate")

# The user with password SSH auth and passwordless sudo (its password is set per testbed at boot).
TEST_USER = "tester"

# nspawn mounts the cgroup v1 controllers read-only; containerd/runc need them writable (TESTBED.md §3).
CGROUP_RW_UNIT = """\
# tether testbed: make the cgroup v1 controllers writable for containerd/runc (nspawn mounts them ro).
[Unit]
Description=tether testbed: remount cgroup v1 controllers read-write
DefaultDependencies=no
Before=containerd.service sysinit.target
After=local-fs.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for c in /sys/fs/cgroup/*/; do case $c in */systemd/|*/unified/) ;; \
*) mount -o remount,bind,rw $c ;; esac; done'

[Install]
WantedBy=sysinit.target
"""

# Per-testbed identity comes from the read-only bind mount /etc/tether-testbed (see nodes.py).
IDENTITY_UNIT = """\
# tether testbed: the test user's password hash and the testbed's host names, from the testbed's bind mount.
[Unit]
Description=tether testbed: node identity (test user password, /etc/hosts)
Before=ssh.service network-pre.target
Wants=network-pre.target
ConditionPathIsDirectory=/etc/tether-testbed

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -ec '[ ! -s /etc/tether-testbed/chpasswd ] || chpasswd -e < /etc/tether-testbed/chpasswd; \
[ ! -s /etc/tether-testbed/hosts ] || grep -qxF "# tether testbed nodes" /etc/hosts || \
cat /etc/tether-testbed/hosts >> /etc/hosts'

[Install]
WantedBy=multi-user.target
"""

SSHD_CONFIG = """\
# tether testbed: one host key per node (bind-mounted), root by key, the test user by password or key.
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication yes
UseDNS no
"""


@dataclasses.dataclass(frozen=True)
class BaseRecipe:
    """What debootstrap and the package download depend on."""

    suite: str = "bookworm"
    mirror: str = "http://deb.debian.org/debian"
    variant: str = "minbase"
    include: tuple[str, ...] = (
        "systemd",
        "systemd-sysv",
        "dbus",
        "openssh-server",
        "python3",
        "ca-certificates",
        "sudo",
        "openssl",
        "curl",
        "iproute2",
        "iputils-ping",
        "procps",
        "gnupg",
        "less",
    )
    # Real Debian packages served by the local apt repo (downloaded with the dependencies the rootfs lacks).
    repo_packages: tuple[str, ...] = (
        "containerd",
        "runc",
        "iptables",
        "conntrack",
        "socat",
        "ebtables",
        "ethtool",
    )


@dataclasses.dataclass(frozen=True)
class Recipe:
    """The whole node rootfs recipe; its hash names the cache entry."""

    base: BaseRecipe = BaseRecipe()
    units: tuple[tuple[str, str], ...] = (
        ("tether-testbed-cgroup-rw.service", CGROUP_RW_UNIT),
        ("tether-testbed-identity.service", IDENTITY_UNIT),
    )
    sshd_config: str = SSHD_CONFIG
    user: str = TEST_USER
    revision: int = 2  # bump when _build_node changes


def digest(obj: object) -> str:
    blob = json.dumps(dataclasses.asdict(obj), sort_keys=True).encode()  # type: ignore[call-overload]
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class CachedRootfs:
    """A finished cache entry: the node rootfs and the Debian packages for the local repo."""

    rootfs: Path
    debs: Path
    digest: str


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, str(DEFAULT_CACHE)))


def ensure(recipe: Recipe | None = None) -> CachedRootfs:
    """Return the cached rootfs for ``recipe``, building what the machine lacks first."""
    recipe = recipe or Recipe()
    before = len(built)
    cached = _ensure(recipe)
    if len(built) > before:
        for gone in prune(cached):
            log.info(f"removed the unused cache entry {gone}")
    return cached


def _ensure(recipe: Recipe) -> CachedRootfs:
    base = _cached(f"base-{digest(recipe.base)}", lambda tmp: _build_base(recipe.base, tmp))
    node = _cached(f"node-{digest(recipe)}", lambda tmp: _build_node(recipe, base, tmp))
    return CachedRootfs(rootfs=node / "rootfs", debs=base / "debs", digest=digest(recipe))


def prune(keep: CachedRootfs) -> list[Path]:
    """Remove cache entries of other recipes that no mount or process uses; returns what was removed."""
    root = cache_dir()
    in_use = Path("/proc/self/mounts").read_text()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            in_use += cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
    removed = []
    for entry in root.glob("*-*"):
        if entry.suffix == ".tmp" or not entry.is_dir() or entry in (keep.rootfs.parent, keep.debs.parent):
            continue
        if str(entry) in in_use:
            continue
        with open(root / f"{entry.name}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # being built right now
            shutil.rmtree(entry, ignore_errors=True)
            (root / f"{entry.name}.lock").unlink(missing_ok=True)
            removed.append(entry)
    return removed


built: list[Path] = []  # cache entries this process built (a new recipe: time to prune old ones)


def _cached(name: str, build: Callable[[Path], None]) -> Path:
    """The cache entry ``name``, built by ``build(tmpdir)`` under a lock unless it is already there."""
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    entry = root / name
    if (entry / "ok").exists():
        return entry
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (entry / "ok").exists():  # built by another run while we waited
            return entry
        tmp = root / f"{name}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        build(tmp)
        (tmp / "ok").write_text(f"{time.time():.0f}\n")
        if entry.exists():
            shutil.rmtree(entry)
        tmp.rename(entry)
        built.append(entry)
    return entry


def _build_base(recipe: BaseRecipe, tmp: Path) -> None:
    started = time.monotonic()
    log.info("building the node rootfs with debootstrap (first use on this machine: ~1.5-2 min)")
    rootfs = tmp / "rootfs"
    _run(
        [
            "debootstrap",
            f"--variant={recipe.variant}",
            "--include=" + ",".join(recipe.include),
            recipe.suite,
            str(rootfs),
            recipe.mirror,
        ]
    )
    log.info("downloading the Debian packages for the local apt repo")
    debs = tmp / "debs"
    debs.mkdir()
    _nspawn_pipe(
        rootfs,
        "apt-get clean && apt-get update -q && apt-get install -y -q --download-only "
        "--no-install-recommends " + " ".join(recipe.repo_packages),
    )
    for deb in (rootfs / "var/cache/apt/archives").glob("*.deb"):
        shutil.move(str(deb), debs / deb.name)
    _nspawn_pipe(rootfs, "apt-get clean && rm -rf /var/lib/apt/lists/*")
    (tmp / "recipe.json").write_text(json.dumps(dataclasses.asdict(recipe), indent=2, sort_keys=True))
    log.info(f"base rootfs built in {time.monotonic() - started:.0f}s")


def _build_node(recipe: Recipe, base: Path, tmp: Path) -> None:
    """Copy the base and do the one-time node prep (identity-free: per-node material is bind-mounted)."""
    log.info("preparing the node rootfs")
    rootfs = tmp / "rootfs"
    subprocess.run(["cp", "-a", "--reflink=auto", str(base / "rootfs"), str(rootfs)], check=True)
    for name, text in recipe.units:
        (rootfs / "etc/systemd/system" / name).write_text(text)
    (rootfs / "etc/ssh/sshd_config.d/tether-testbed.conf").write_text(recipe.sshd_config)
    for key in (rootfs / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    for path in ("etc/hostname", "etc/apt/sources.list", "etc/apt/sources.list.d/debian.sources"):
        (rootfs / path).unlink(missing_ok=True)
    (rootfs / "etc/machine-id").write_text("")  # nspawn --uuid gives each node a stable machine id
    (rootfs / "var/lib/dbus/machine-id").unlink(missing_ok=True)  # else every node inherits debootstrap's
    (rootfs / "etc/tether-testbed").mkdir(exist_ok=True)
    (rootfs / "etc/kubernetes").mkdir(exist_ok=True)
    (rootfs / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    (rootfs / "root/.ssh/authorized_keys").touch(mode=0o600)  # bind-mount target
    sudoers = rootfs / "etc/sudoers.d/tether-testbed"
    sudoers.write_text(f"# tether testbed test user\n{recipe.user} ALL=(ALL:ALL) NOPASSWD:ALL\n")
    sudoers.chmod(0o440)
    enable = " ".join(["systemd-networkd"] + [name for name, _ in recipe.units])
    home = f"/home/{recipe.user}"
    _nspawn_pipe(
        rootfs,
        f"useradd -m -s /bin/bash -G sudo {recipe.user} && "
        f"install -d -m700 -o {recipe.user} -g {recipe.user} {home}/.ssh && "
        f"install -m644 /dev/null {home}/.ssh/authorized_keys && "
        f"systemctl enable {enable} && rm -rf /var/log/*.log /var/log/apt/* /var/cache/debconf/*-old",
    )
    (tmp / "recipe.json").write_text(json.dumps(dataclasses.asdict(recipe), indent=2, sort_keys=True))


def _nspawn_pipe(rootfs: Path, script: str) -> None:
    """Run ``script`` in the rootfs (host network, no boot); nspawn leaves an empty propagate dir behind."""
    machine = f"tbbuild-{os.getpid()}"
    _run(
        [
            "systemd-nspawn",
            "-q",
            "-D",
            str(rootfs),
            f"--machine={machine}",
            "--register=no",
            "--keep-unit",
            "--pipe",
            "/bin/sh",
            "-ec",
            script,
        ]
    )
    with contextlib.suppress(OSError):
        (NSPAWN_PROPAGATE / machine).rmdir()


def _run(argv: list[str]) -> None:
    """Run a build command, its output going to our stderr (the build's progress)."""
    subprocess.run(argv, check=True, stdout=sys.stderr, stdin=subprocess.DEVNULL)
