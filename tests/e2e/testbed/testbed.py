"""The testbed: N nodes on a private bridge plus the package server, driven from Python or the CLI.

``Testbed.up(state_dir, nodes=3)`` builds what is missing (rootfs, repo), boots the nodes and returns
once every node serves SSH and has finished booting; ``Testbed.load(state_dir)`` reattaches to a running
testbed (for instance one the CLI started); ``down()`` / ``Testbed.down_dir(state_dir)`` remove it all.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tests.e2e.testbed import aptrepo, cgroups, log, mirror, network, nodes, ociimage, packages, rootfs
from tests.e2e.testbed.nodes import Node
from tests.e2e.testbed.procs import Proc, matching, spawn_daemon
from tests.e2e.testbed.state import State

T = TypeVar("T")
HERE = Path(__file__).parent
SSH_OPTS = (
    "-o",
    "BatchMode=yes",
    "-o",
    "ConnectTimeout=3",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "StrictHostKeyChecking=yes",
)


class TestbedError(RuntimeError):
    """The testbed could not be brought up or a node did not respond as expected."""

    __test__ = False  # not a pytest test class


class Testbed:
    """A running testbed, backed by its state directory."""

    __test__ = False  # not a pytest test class

    def __init__(self, state: State) -> None:
        self.state = state

    # ----------------------------------------------------------------- lifecycle

    @classmethod
    def up(
        cls,
        state_dir: Path,
        nodes: int = 3,
        *,
        lb: bool = False,
        volatile: bool = False,
        boot_timeout: float = 120.0,
    ) -> Testbed:
        """Create and boot a testbed; on failure everything made so far is removed again."""
        if not 1 <= nodes <= 200:
            raise ValueError("nodes must be between 1 and 200")
        state = State.create(state_dir)
        bed = cls(state)
        try:
            bed._up(nodes, lb=lb, volatile=volatile, boot_timeout=boot_timeout)
        except BaseException:
            log.info("up failed; removing what was made")
            bed.down()
            raise
        return bed

    @classmethod
    def load(cls, state_dir: Path) -> Testbed:
        return cls(State.load(state_dir))

    def _up(self, count: int, *, lb: bool, volatile: bool, boot_timeout: float) -> None:
        started = time.monotonic()
        cached = rootfs.ensure()
        st = self.state
        st.data.update(rootfs=str(cached.rootfs), debs=str(cached.debs), volatile=volatile)
        slot = network.allocate(st.dir)
        st.data.update(
            slot=slot,
            bridge=network.bridge_name(slot),
            bridge_ip=network.bridge_ip(slot),
            subnet=str(network.subnet(slot)),
        )
        st.save()
        log.info(f"bridge {st['bridge']} {st['bridge_ip']}/24")
        self._identity(count)
        self._services()
        keeper = st.dir / "keeper.sh"
        keeper.write_text(nodes.KEEPER)
        for index in range(1, count + 1):
            node = nodes.new(st.dir, slot, index)
            nodes.prepare(node, slot)
            self._save_node(node)
        self._write_known_hosts()
        if lb:
            self.start_lb()
        for node in self.nodes:
            self._boot(node)
        log.info(f"booting {count} node(s)")
        states = _parallel(lambda n: self.wait_ssh(n.name, boot_timeout), self.nodes)
        for node, system_state in zip(self.nodes, states, strict=True):
            log.info(f"{node.name} {node.ip}: {system_state}")
        log.info(f"testbed up in {time.monotonic() - started:.1f}s")

    def _identity(self, count: int) -> None:
        """Client key, test user password (hash on the nodes), /etc/hosts lines for every node."""
        st = self.state
        key = st.dir / "client_key"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tether-testbed", "-f", str(key)],
            check=True,
        )
        common = st.dir / "common"
        (common / "etc").mkdir(parents=True, exist_ok=True)
        auth = common / "authorized_keys"
        auth.write_text(key.with_suffix(".pub").read_text())
        auth.chmod(0o644)
        password = secrets.token_urlsafe(12)  # a throwaway test secret, recorded in the state
        hashed = subprocess.run(
            ["openssl", "passwd", "-6", "-stdin"], input=password, capture_output=True, text=True, check=True
        ).stdout.strip()
        (common / "etc/chpasswd").write_text(f"{rootfs.TEST_USER}:{hashed}\n")
        hosts = "".join(f"{network.node_ip(st['slot'], i)} node{i}\n" for i in range(1, count + 1))
        (common / "etc/hosts").write_text("# tether testbed nodes\n" + hosts)
        st.data.update(
            client_key=str(key), user={"name": rootfs.TEST_USER, "password": password, "sudo": "nopasswd"}
        )
        st.save()

    def _services(self) -> None:
        """Build the apt repo, download mirror and test image; start the package server (and the LB)."""
        st = self.state
        www = st.dir / "www"
        log.info("building the local apt repo (Debian debs + stand-in Kubernetes packages) and the mirror")
        repo = aptrepo.build(www, Path(st["debs"]), st.dir / "gnupg")
        mirror_files = mirror.build(www)
        image_ref = ociimage.build(www / "images/busybox-oci.tar")
        port = self._daemon("http", HERE / "httpserve.py", "--root", str(www))
        base = f"http://{st['bridge_ip']}:{port}"
        services: dict[str, Any] = {
            "apt_repo_url": f"{base}/apt",
            "apt_repo_key_url": f"{base}/apt/Release.key",
            "apt_repo_keyring_url": f"{base}/apt/tether-testbed.gpg",
            "apt_keyring_path": aptrepo.KEYRING_PATH,
            "apt_source": f"deb [signed-by={aptrepo.KEYRING_PATH}] {base}/apt ./",
            "apt_source_trusted": f"deb [trusted=yes] {base}/apt ./",
            "apt_packages": repo.packages,
            "download_mirror_url": f"{base}/mirror",
            "mirror_files": mirror_files,
            "kubernetes_version": packages.K8S_VERSION,
            "kubernetes_package_version": packages.DEB_VERSION,
            "images": {"busybox": {"url": f"{base}/images/busybox-oci.tar", "ref": image_ref}},
        }
        st["services"] = services

    def start_lb(self, backends: list[str] | None = None) -> str:
        """Start the TCP load balancer on the bridge, forwarding to :6443 of ``backends`` (default: all)."""
        st = self.state
        self.set_lb_backends(backends)
        port = self._daemon("lb", HERE / "lb.py", "--backends", str(st.dir / "lb-backends.json"))
        endpoint = f"{st['bridge_ip']}:{port}"
        st["services"] = {**st.get("services", {}), "lb_endpoint": endpoint}
        log.info(f"load balancer on {endpoint}")
        return endpoint

    def set_lb_backends(self, names: list[str] | None = None, port: int = 6443) -> None:
        """Which nodes' ``port`` the load balancer forwards to (None: every node); takes effect at once."""
        chosen = self.nodes if names is None else [self.node(n) for n in names]
        path = self.state.dir / "lb-backends.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([f"{n.ip}:{port}" for n in chosen]))
        tmp.replace(path)

    def _daemon(self, name: str, script: Path, *args: str) -> int:
        """Start a detached helper bound to the bridge address; returns the port it picked."""
        st = self.state
        port_file = st.dir / f"{name}.port"
        port_file.unlink(missing_ok=True)
        argv = [sys.executable, str(script), "--bind", st["bridge_ip"], "--port-file", str(port_file), *args]
        proc = spawn_daemon(argv, st.dir / f"{name}.log")
        st["procs"] = {**st.get("procs", {}), name: proc.to_json()}
        deadline = time.monotonic() + 15
        while not port_file.exists():
            if not proc.alive() or time.monotonic() > deadline:
                raise TestbedError(f"{name} server did not start; see {st.dir / f'{name}.log'}")
            time.sleep(0.02)
        return int(port_file.read_text())

    def apt_setup_command(self, signed: bool = True) -> str:
        """Shell command that points a node's apt at the local repo (as a real install script would)."""
        sv = self.state["services"]
        if not signed:
            source = sv["apt_source_trusted"]
            return f"echo '{source}' > /etc/apt/sources.list.d/tether-testbed.list && apt-get update -q"
        return (
            "install -d -m 0755 /etc/apt/keyrings && "
            f"curl -fsSL {sv['apt_repo_key_url']} | gpg --batch "
            f"--yes --dearmor -o {sv['apt_keyring_path']} && "
            f"echo '{sv['apt_source']}' > /etc/apt/sources.list.d/tether-testbed.list && apt-get update -q"
        )

    def expire_join_material(
        self, control_plane: str, *, tokens: bool = True, certificate_key: bool = True
    ) -> None:
        """Force the stand-in cluster's bootstrap tokens and/or certificate key to expire now."""
        flags = (["--tokens"] if tokens else []) + (["--certificate-key"] if certificate_key else [])
        self.exec(control_plane, ["kubeadm-standin", "expire", *flags])

    def _boot(self, node: Node) -> None:
        st = self.state
        if not node.cgroups:
            node.cgroups = [str(p) for p in _cgroup_paths(node.machine)]
            self._save_node(node)
            cgroups.create(f"tether-testbed-{node.machine}")
        volatile = bool(st.get("volatile"))
        if not volatile and not node.root.is_mount():
            node.mounted = True
            self._save_node(node)
            nodes.mount_root(node, Path(st["rootfs"]))
        args = nodes.nspawn_args(node, Path(st["rootfs"]), st["bridge"], st.dir / "common", volatile)
        node.keeper = nodes.start(node, args, st.dir / "keeper.sh").to_json()
        self._save_node(node)

    def down(self) -> list[str]:
        """Remove everything this testbed made; returns problems (empty when all is gone)."""
        return down_dir(self.state.dir)

    @staticmethod
    def down_dir(state_dir: Path) -> list[str]:
        return down_dir(state_dir)

    # ----------------------------------------------------------------- description

    def describe(self) -> dict[str, Any]:
        """The JSON the CLI prints: everything a test needs to reach the testbed."""
        st = self.state
        out: dict[str, Any] = {
            "state_dir": str(st.dir),
            "bridge": st["bridge"],
            "bridge_ip": st["bridge_ip"],
            "subnet": st["subnet"],
            "ssh_key": st["client_key"],
            "known_hosts": str(st.dir / "known_hosts"),
            "user": st["user"],
            "nodes": [
                {
                    "name": n.name,
                    "ip": n.ip,
                    "ssh_user": "root",
                    "host_key": n.host_key,
                    "machine": n.machine,
                    "machine_id": n.uuid.replace("-", ""),
                    "leader_pid": n.leader(),
                }
                for n in self.nodes
            ],
        }
        out.update(st.get("services", {}))
        return out

    # ----------------------------------------------------------------- nodes

    @property
    def nodes(self) -> list[Node]:
        return [Node.from_json(d) for d in sorted(self.state.nodes.values(), key=lambda d: d["index"])]

    def node(self, name: str) -> Node:
        try:
            return Node.from_json(self.state.nodes[name])
        except KeyError:
            raise KeyError(f"no node {name!r} in this testbed (have {', '.join(self.state.nodes)})") from None

    def _save_node(self, node: Node) -> None:
        self.state.nodes[node.name] = node.to_json()
        self.state.save()

    def _write_known_hosts(self) -> None:
        lines = [f"{n.ip} {n.host_key}\n{n.name} {n.host_key}\n" for n in self.nodes]
        (self.state.dir / "known_hosts").write_text("".join(lines))

    def ssh_argv(self, name: str, command: str, user: str = "root") -> list[str]:
        """``ssh`` to a node as ``user`` with the client key, verifying the node's host key."""
        node = self.node(name)
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            self.state["client_key"],
            "-o",
            f"UserKnownHostsFile={self.state.dir / 'known_hosts'}",
            *SSH_OPTS,
            f"{user}@{node.ip}",
            "--",
            command,
        ]

    def ssh(
        self,
        name: str,
        command: str,
        *,
        user: str = "root",
        check: bool = True,
        timeout: float = 120.0,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on a node over real SSH; raises on a non-zero exit when ``check``."""
        result = subprocess.run(
            self.ssh_argv(name, command, user), capture_output=True, text=True, timeout=timeout, input=input
        )
        if check and result.returncode != 0:
            raise TestbedError(
                f"{name}$ {command}\nexit "
                f"{result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
            )
        return result

    def asyncssh_options(self, name: str, user: str = "root", password: str | None = None) -> dict[str, Any]:
        """Keyword arguments for ``asyncssh.connect(node_ip, **opts)``: the node's host key pinned, and the
        client key (or ``password`` for the test user, see ``describe()['user']``)."""
        import asyncssh

        node = self.node(name)
        opts: dict[str, Any] = {
            "username": user,
            "known_hosts": asyncssh.import_known_hosts(f"{node.ip} {node.host_key}\n"),
            "connect_timeout": 10,
        }
        if password is None:
            opts["client_keys"] = [self.state["client_key"]]
        else:
            opts.update(password=password, client_keys=None, agent_path=None)
        return opts

    def exec_argv(self, name: str, command: Sequence[str]) -> list[str]:
        """argv that runs ``command`` as root inside a node via nsenter (no SSH involved)."""
        return nodes.nsenter_argv(self.node(name), list(command))

    def exec(
        self,
        name: str,
        command: str | Sequence[str],
        *,
        check: bool = True,
        timeout: float = 120.0,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command (a shell string or an argv) as root inside a node without SSH."""
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        result = subprocess.run(
            self.exec_argv(name, argv), capture_output=True, text=True, timeout=timeout, input=input
        )
        if check and result.returncode != 0:
            raise TestbedError(
                f"{name}# {command}\nexit {result.returncode}\n{result.stdout}\n{result.stderr}"
            )
        return result

    def wait_ssh(self, name: str, timeout: float = 120.0) -> str:
        """Wait until the node serves SSH and has booted; returns ``systemctl is-system-running``."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                result = self.ssh(
                    name,
                    "systemctl is-system-running --wait",
                    check=False,
                    timeout=max(1.0, deadline - time.monotonic()),
                )
            except subprocess.TimeoutExpired:
                break
            if result.returncode != 255 and result.stdout.strip():
                return result.stdout.strip()
            last = result.stderr.strip()
            time.sleep(0.2)
        raise TestbedError(
            f"{name}: no SSH after {timeout:.0f}s ({last}); see {self.node(name).dir / 'console.log'}"
        )

    def reboot(self, name: str, *, wait: bool = True, timeout: float = 120.0) -> None:
        """Reboot a node from the inside (``systemctl reboot``); with ``wait``, until it serves SSH again."""
        node = self.node(name)
        old = node.nspawn()
        if old is None:
            raise TestbedError(f"{name} is not running")
        self.exec(name, ["systemctl", "reboot", "--no-block"], check=False, timeout=30)
        if wait:
            nodes.wait_nspawn(node, timeout, other_than=old.pid)
            self.wait_ssh(name, timeout)

    def stop(self, name: str, timeout: float = 20.0) -> None:
        """Power a node off (it stays stopped until ``start``)."""
        nodes.stop(self.node(name), timeout)

    def start(self, name: str, *, wait: bool = True, timeout: float = 120.0) -> None:
        """Boot a stopped node again, with the same identity."""
        node = self.node(name)
        if node.nspawn() is not None:
            raise TestbedError(f"{name} is already running")
        self._boot(node)
        if wait:
            self.wait_ssh(name, timeout)

    def running(self, name: str) -> bool:
        return self.node(name).nspawn() is not None

    def link_down(self, name: str) -> None:
        """Cut the node off the network (its host-side veth goes down; the node keeps its address)."""
        network.set_link(self.node(name).veth, up=False)

    def link_up(self, name: str) -> None:
        network.set_link(self.node(name).veth, up=True)


def _cgroup_paths(machine: str) -> list[Path]:
    """Where cgroups.create will put the node's cgroups (recorded before they exist)."""
    paths = []
    name = f"tether-testbed-{machine}"
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, current = line.split(":", 2)
        hierarchy = "unified" if controllers == "" else controllers.removeprefix("name=")
        mount = cgroups.ROOT / hierarchy
        if mount.is_dir() and (mount / "cgroup.procs").exists():
            paths.append(mount / current.strip("/") / name)
    return paths


def down_dir(state_dir: Path) -> list[str]:
    """Tear down the testbed recorded in ``state_dir`` (idempotent, works after a crashed ``up``)."""
    state_dir = state_dir.resolve()
    if not State.exists(state_dir):
        _release_orphan_slots(state_dir)
        return []
    st = State.load(state_dir)
    bed = Testbed(st)
    problems: list[str] = []
    for name, record in st.get("procs", {}).items():
        Proc.from_json(record).stop(5)
        log.info(f"stopped {name}")
    results = _parallel(nodes.teardown, bed.nodes)
    for straggler in matching(f"{state_dir}/"):  # e.g. ssh clients of an `up` that was killed
        straggler.stop(3)
    problems += [p for result in results for p in result]
    if "bridge" in st.data:
        network.delete_link(st["bridge"])
        if network.link_exists(st["bridge"]):
            problems.append(f"bridge {st['bridge']} still there")
    gnupg = state_dir / "gnupg"
    if gnupg.is_dir():
        subprocess.run(
            ["gpgconf", "--homedir", str(gnupg), "--kill", "all"], capture_output=True, check=False
        )
    if problems:  # keep the slot reserved: what is left still uses its names
        log.info("down left: " + "; ".join(problems))
        return problems
    if "slot" in st.data:
        network.release(st["slot"], state_dir)
    _release_orphan_slots(state_dir)
    for sub in ("nodes", "www", "gnupg", "common"):
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(state_dir / sub)
    (state_dir / "down.json").write_text(json.dumps({"removed": st.data}, indent=2, sort_keys=True))
    st.remove()
    log.info(f"testbed in {state_dir} removed")
    return problems


def _release_orphan_slots(state_dir: Path) -> None:
    """Slots registered for this state dir whose state never recorded them (``up`` killed in between)."""
    reg = network.registry()
    for record in reg.glob("*.json") if reg.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, KeyError):
            if json.loads(record.read_text())["state_dir"] == str(state_dir):
                slot = int(record.stem)
                network.delete_link(network.bridge_name(slot))
                network.release(slot, state_dir)


def _parallel(fn: Callable[[T], Any], items: Iterable[T]) -> list[Any]:
    items = list(items)
    if not items:
        return []
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(items))) as pool:
        return list(pool.map(fn, items))
