"""One testbed node: a systemd-nspawn container booted from the shared rootfs, with its own identity.

Identity that survives reboots: hostname, machine id (``--uuid``), SSH host key (generated per node and
bind-mounted), address (a networkd file, bind-mounted). The root is an overlay of the shared read-only
rootfs with a per-node upper dir on disk, so a reboot keeps what was installed (like a real disk);
``volatile=True`` uses nspawn's ``--volatile=overlay`` instead (a fresh node every boot).

A small keeper shell loop runs nspawn and starts it again when the node reboots (exit status 133), the
way host systemd's ``systemd-nspawn@.service`` would; it survives the process that started it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from tests.e2e.testbed import cgroups, network
from tests.e2e.testbed.procs import Proc, matching, spawn_daemon

NSPAWN_PROPAGATE = Path("/run/systemd/nspawn/propagate")
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

KEEPER = r"""#!/bin/sh
# tether testbed node keeper: run systemd-nspawn for one node (in the node's own cgroups) and start it
# again when the node reboots (nspawn exits 133), like RestartForceExitStatus=133 in systemd-nspawn@.service.
dir=$1; shift
while :; do
  sh -c 'for cg in $(cat "$0/cgroups"); do echo $$ > "$cg/cgroup.procs" || exit 1; done
         echo $$ > "$0/nspawn.pid"; exec systemd-nspawn "$@"' "$dir" "$@"
  rc=$?
  echo "[keeper] systemd-nspawn exited with status $rc"
  [ "$rc" -eq 133 ] || exit "$rc"
done
"""


@dataclasses.dataclass
class Node:
    """A node's record (``state.json`` keeps it as a dict under ``nodes``)."""

    name: str  # hostname, and the name tests use
    machine: str  # nspawn machine name, unique on the machine (veth vb-<machine>)
    index: int
    ip: str
    uuid: str
    dir: Path
    host_key: str = ""  # the public host key line
    cgroups: list[str] = dataclasses.field(default_factory=list)
    mounted: bool = False
    keeper: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["dir"] = str(self.dir)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Node:
        return cls(**{**data, "dir": Path(data["dir"])})

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @property
    def veth(self) -> str:
        return network.host_veth(self.machine)

    def nspawn(self) -> Proc | None:
        """The running systemd-nspawn of this node, if any."""
        try:
            pid = int((self.dir / "nspawn.pid").read_text())
        except (OSError, ValueError):
            return None
        proc = Proc.of(pid)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        if (
            not proc.alive()
            or b"systemd-nspawn" not in cmdline[0]
            or f"-M{self.machine}".encode() not in cmdline
        ):
            return None
        return proc

    def leader(self) -> int | None:
        """PID (host view) of the node's init, the target for nsenter."""
        proc = self.nspawn()
        if proc is None:
            return None
        for status in Path("/proc").glob("[0-9]*/status"):
            with contextlib.suppress(OSError):
                fields = dict(
                    line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line
                )
                nspid = fields.get("NSpid", "").split()
                if fields.get("PPid", "").strip() == str(proc.pid) and len(nspid) > 1 and nspid[-1] == "1":
                    return int(nspid[0])
        return None


def new(state_dir: Path, slot: int, index: int) -> Node:
    name = f"node{index}"
    return Node(
        name=name,
        machine=f"tb{slot}n{index}",
        index=index,
        ip=network.node_ip(slot, index),
        uuid=str(uuid.uuid4()),
        dir=state_dir / "nodes" / name,
    )


def prepare(node: Node, slot: int) -> None:
    """Per-node files: SSH host key, networkd config, overlay dirs."""
    node.dir.mkdir(parents=True, exist_ok=True)
    key = node.dir / "ssh_host_ed25519_key"
    if not key.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{node.name}", "-f", str(key)],
            check=True,
        )
    node.host_key = " ".join(key.with_suffix(".pub").read_text().split()[:2])
    (node.dir / "host0.network").write_text(
        "# tether testbed: the node's address on the testbed bridge (a pulled cable keeps it)\n"
        "[Match]\nName=host0\n\n"
        f"[Network]\nAddress={node.ip}/24\nGateway={network.bridge_ip(slot)}\n"
        "LinkLocalAddressing=no\nIPv6AcceptRA=no\nConfigureWithoutCarrier=yes\nIgnoreCarrierLoss=yes\n"
    )
    for sub in ("upper", "work", "root", "containerd"):
        (node.dir / sub).mkdir(exist_ok=True)


def nspawn_args(node: Node, rootfs: Path, bridge: str, common: Path, volatile: bool) -> list[str]:
    """The systemd-nspawn command line (TESTBED.md §2a and §3: containerd-ready)."""
    args = [
        "-b",
        f"-M{node.machine}",
        f"--hostname={node.name}",
        f"--uuid={node.uuid}",
        "--register=no",
        "--keep-unit",
        f"--network-bridge={bridge}",
        "--console=read-only",
        "--system-call-filter=@keyring",
        f"--bind-ro={node.dir / 'host0.network'}:/etc/systemd/network/10-host0.network",
        f"--bind-ro={node.dir / 'ssh_host_ed25519_key'}:/etc/ssh/ssh_host_ed25519_key",
        f"--bind-ro={node.dir / 'ssh_host_ed25519_key.pub'}:/etc/ssh/ssh_host_ed25519_key.pub",
        f"--bind-ro={common / 'authorized_keys'}:/root/.ssh/authorized_keys",
        f"--bind-ro={common / 'authorized_keys'}:/home/tester/.ssh/authorized_keys",
        f"--bind-ro={common / 'etc'}:/etc/tether-testbed",
    ]
    if volatile:
        # overlayfs cannot be containerd's snapshot dir, and a volatile node keeps nothing anyway
        return [*args, "-D", str(rootfs), "--volatile=overlay", "--tmpfs=/var/lib/containerd"]
    return [*args, "-D", str(node.root), f"--bind={node.dir / 'containerd'}:/var/lib/containerd"]


def mount_root(node: Node, rootfs: Path) -> None:
    """The node's disk: the shared rootfs under a per-node upper dir (kept across reboots)."""
    opts = f"lowerdir={rootfs},upperdir={node.dir / 'upper'},workdir={node.dir / 'work'}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(node.root)], check=True)


def start(node: Node, args: list[str], keeper_script: Path) -> Proc:
    """Start the node's keeper (which runs nspawn in the node's cgroups); returns the keeper."""
    (node.dir / "cgroups").write_text("".join(f"{cg}\n" for cg in node.cgroups))
    (node.dir / "nspawn.pid").unlink(missing_ok=True)
    return spawn_daemon(["/bin/sh", str(keeper_script), str(node.dir), *args], node.dir / "console.log")


def wait_nspawn(node: Node, timeout: float, other_than: int | None = None) -> Proc:
    """Wait for the node's nspawn (a new one when ``other_than`` is the old PID)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = node.nspawn()
        if proc is not None and proc.pid != other_than and node.leader() is not None:
            return proc
        time.sleep(0.05)
    raise TimeoutError(f"{node.name}: systemd-nspawn did not start; see {node.dir / 'console.log'}")


def stop(node: Node, timeout: float = 20.0) -> None:
    """Power the node off cleanly (SIGTERM to nspawn); kill whatever is left after ``timeout``."""
    keeper = Proc.from_json(node.keeper) if node.keeper else None
    proc = node.nspawn()
    if proc is not None:
        proc.signal(15)
        if not proc.wait(timeout):
            proc.signal(9)
            proc.wait(5)
    if keeper is not None:
        keeper.stop(5)
    # a keeper killed mid-start may leave its child (not yet in the node's cgroups) behind
    for straggler in matching(f"{node.dir}/"):
        straggler.stop(5)
    cgroups.kill_all([Path(p) for p in node.cgroups])


def teardown(node: Node) -> list[str]:
    """Remove everything of the node on the host; returns what could not be removed."""
    stop(node)
    problems: list[str] = []
    if node.root.is_mount() or node.mounted:
        for lazy in ([], ["-l"]):
            if subprocess.run(["umount", *lazy, str(node.root)], capture_output=True).returncode == 0:
                break
    if node.root.is_mount():
        problems.append(f"{node.root} still mounted")
    problems += [f"cgroup {p}" for p in cgroups.remove([Path(p) for p in node.cgroups])]
    if network.link_exists(node.veth):
        network.delete_link(node.veth)
    with contextlib.suppress(OSError):
        (NSPAWN_PROPAGATE / node.machine).rmdir()
    return problems


def nsenter_argv(node: Node, command: list[str]) -> list[str]:
    """Run ``command`` as root inside the node's namespaces and cgroups, without SSH (the SSM path)."""
    leader = node.leader()
    if leader is None:
        raise RuntimeError(f"{node.name} is not running")
    moves = "".join(f'echo $$ > "{cg}/cgroup.procs"; ' for cg in node.cgroups)
    return [
        "/bin/sh",
        "-c",
        moves + 'exec "$@"',
        "nsenter",
        "nsenter",
        "-t",
        str(leader),
        "-m",
        "-u",
        "-i",
        "-n",
        "-p",
        "-C",
        "-r",
        "-w",
        "--",
        "/usr/bin/env",
        "-i",
        f"PATH={NODE_PATH}",
        "HOME=/root",
        "LANG=C.UTF-8",
        "USER=root",
        *command,
    ]
