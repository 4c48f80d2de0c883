"""Fakes at the bootstrap's seams: a simulated machine behind a FakeTransport, a FakeRegistry.

``FakeMachine`` answers the commands the bootstrap sends the way a Debian/Rocky host with
systemd would: detection output from its state, files written atomically with their modes,
``systemctl restart`` starting an agent that enrolls at the ``FakeRegistry`` with the join token
it finds on disk. Any command it does not recognise fails the test, so a new remote command
cannot slip in untested. ``changes`` records everything that modified the machine.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from tether.bootstrap.bundle import AgentBundle, BundleSpec
from tether.bootstrap.errors import ControllerError
from tether.bootstrap.events import BootstrapEvent
from tether.bootstrap.layout import DEFAULT_LAYOUT
from tether.bootstrap.registry import JoinToken, NodeView
from tether.bootstrap.transport import CommandResult, Transport
from tether.nodeagent.secrets import Secret

LAYOUT = DEFAULT_LAYOUT
CA_HASH = "sha256:" + "ab" * 32


@dataclass
class FakeRegistry:
    environments: set[str] = field(default_factory=lambda: {"lab"})
    nodes: dict[str, NodeView] = field(default_factory=dict)
    tokens: dict[str, tuple[str, str, bool]] = field(default_factory=dict)  # id -> (secret, node, used)
    revoked: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    ca_hash: str = CA_HASH

    async def get_node(self, name: str) -> NodeView | None:
        return self.nodes.get(name)

    async def require_environment(self, name: str) -> None:
        if name not in self.environments:
            raise ControllerError(f"environment {name!r} not found")

    async def create_token(
        self, *, environment: str, role: str, node_name: str, ttl_seconds: int, description: str
    ) -> JoinToken:
        token_id = f"t{len(self.tokens):05d}"
        secret = f"{token_id}.canarycanarycanary{len(self.tokens):014d}"
        self.tokens[token_id] = (secret, node_name, False)
        self.created.append(token_id)
        return JoinToken(Secret(secret), token_id, CA_HASH)

    async def revoke_token(self, token_id: str) -> None:
        self.revoked.append(token_id)

    def enroll(self, token: str, node_name: str, fingerprint: str, environment: str, role: str) -> bool:
        token_id = token.split(".")[0]
        secret, scope, used = self.tokens.get(token_id, ("", "", True))
        if secret != token or used or scope != node_name or token_id in self.revoked:
            return False
        self.tokens[token_id] = (secret, scope, True)
        self.nodes[node_name] = NodeView(
            node_name, environment, role, False, True, "provisioning", fingerprint
        )
        return True


@dataclass
class FakeMachine:
    """The state of one simulated host."""

    hostname: str = "gpu-1"
    os_id: str = "debian"
    os_version: str = "12"
    pretty: str = "Debian GNU/Linux 12 (bookworm)"
    machine: str = "x86_64"
    systemd: bool = True
    pythons: dict[str, str] = field(default_factory=lambda: {"/usr/bin/python3": "3.11.2"})
    libc: str = "glibc 2.36"
    package_manager: str = "apt-get"
    installable: dict[str, str] = field(default_factory=dict)  # package -> version it installs
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    unit_active: str = "inactive"
    agent_enrolls: bool = True  # the started agent manages to enroll
    unpack_fails: bool = False  # the node refuses the bundle (a checksum mismatch)
    registry: FakeRegistry | None = None
    changes: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    stdin_seen: list[bytes] = field(default_factory=list)

    def has(self, path: str) -> bool:
        return path in self.files

    def text(self, path: str) -> str:
        return self.files[path][0].decode()

    def mode(self, path: str) -> int:
        return self.files[path][1]

    def give_identity(self, fingerprint: str = "f" * 64) -> None:
        for path in LAYOUT.identity_files:
            self.files[path] = (b"x", 0o600)
        self.files[LAYOUT.cert] = (fingerprint.encode(), 0o600)

    @property
    def fingerprint(self) -> str:
        return self.files[LAYOUT.cert][0].decode() if self.has(LAYOUT.cert) else ""

    # -- how the simulated host answers -------------------------------------------------------

    def detect_output(self) -> str:
        lines = [
            "uname_s=Linux",
            f"uname_m={self.machine}",
            "kernel=6.1.0-test",
            f"hostname={self.hostname}",
            f"os_id={self.os_id}",
            f"os_version_id={self.os_version}",
            "os_like=",
            f"os_pretty={self.pretty}",
            "systemctl=1",
            f"pkg={self.package_manager}",
            "free_kb=9000000",
            "machine_id=m1",
            "boot_id=b1",
        ]
        if self.systemd:
            lines.append("systemd=1")
        for path, version in self.pythons.items():
            lines.append(f"python={path} {version} {self.libc} ok")
        if self.has(LAYOUT.marker):
            import base64

            lines.append("marker=" + base64.b64encode(self.files[LAYOUT.marker][0]).decode())
        if all(self.has(p) for p in LAYOUT.identity_files):
            lines.append("identity=1")
        lines.append(f"unit_active={self.unit_active}")
        return "\n".join(lines) + "\n"

    def start_agent(self) -> None:
        self.unit_active = "active"
        if all(self.has(p) for p in LAYOUT.identity_files) or not self.agent_enrolls:
            if not self.agent_enrolls:
                self.unit_active = "failed"
            return
        assert self.registry is not None
        config = self.text(LAYOUT.config)
        node = re.search(r"node_name: (\S+)", config)
        env = re.search(r"environment: (\S+)", config)
        role = re.search(r"role: (\S+)", config)
        assert node and env and role, config
        token = self.text(LAYOUT.token).strip() if self.has(LAYOUT.token) else ""
        fingerprint = hashlib.sha256(node.group(1).encode()).hexdigest()
        if self.registry.enroll(token, node.group(1), fingerprint, env.group(1), role.group(1)):
            self.give_identity(fingerprint)
        else:
            self.unit_active = "failed"


class FakeTransport(Transport):
    kind = "fake"

    def __init__(self, machine: FakeMachine, *, confidential: bool = True) -> None:
        super().__init__(f"root@{machine.hostname}")
        self.machine = machine
        self.confidential_input = confidential
        self.closed = False

    async def run(self, command: str, *, stdin: bytes | None = None, timeout: float = 300) -> CommandResult:
        m = self.machine
        m.commands.append(command)
        if stdin:
            m.stdin_seen.append(stdin)
        ok = CommandResult(0, "", "")
        if "uname_s=" in command:
            return CommandResult(0, m.detect_output(), "")
        if command == "id -u":
            return CommandResult(0, "0\n", "")
        if command.startswith("test -f "):
            return ok if m.has(shlex.split(command)[2]) else CommandResult(1, "", "")
        if "import compileall" in command:
            if m.unpack_fails:
                return CommandResult(1, "", "agent bundle checksum mismatch: expected a, got b\n")
            args = shlex.split(command)
            agents, bundle_id = args[-4], args[-3]
            m.files[f"{agents}/{bundle_id}/BUNDLE.json"] = (b"{}", 0o644)
            m.files.pop(args[-7], None)  # the archive
            m.changes.append(f"unpack {bundle_id}")
            return CommandResult(0, "unpacked\n", "")
        if command.endswith(" version") and LAYOUT.launcher in command:
            return CommandResult(0, "0.1.0\n", "")
        if command.startswith("systemctl daemon-reload"):
            m.changes.append("systemctl enable+restart")
            m.start_agent()
            return ok
        if command.startswith("systemctl is-active"):
            return CommandResult(0 if m.unit_active == "active" else 3, m.unit_active + "\n", "")
        if "PEM_cert_to_DER_cert" in command:
            return CommandResult(0, m.fingerprint + "\n", "")
        if command.startswith("journalctl"):
            return CommandResult(0, "enrollment refused: token used up\n", "")
        if command.startswith("rm -f "):
            path = shlex.split(command)[2]
            if m.files.pop(path, None) is not None:
                m.changes.append(f"rm {path}")
            return ok
        for package, version in m.installable.items():
            if "install -y" in command and package in command:
                m.pythons[f"/usr/bin/{package}"] = version
                m.changes.append(f"install {package}")
                return ok
        raise AssertionError(f"the fake machine does not know this command: {command[:200]!r}")

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self.machine.files[path] = (data, mode)
        self.machine.changes.append(f"write {path} {mode:o}")

    async def close(self) -> None:
        self.closed = True


class FakeBundles:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.specs: list[BundleSpec] = []

    async def get(self, spec: BundleSpec) -> AgentBundle:
        self.specs.append(spec)
        path = self.tmp / f"bundle-{spec.tag}.tar.gz"
        path.write_bytes(b"bundle for " + spec.tag.encode())
        data = path.read_bytes()
        return AgentBundle(path, hashlib.sha256(data).hexdigest(), len(data), spec)


@dataclass
class Events:
    """An EventSink that keeps everything."""

    items: list[BootstrapEvent] = field(default_factory=list)

    def __call__(self, event: BootstrapEvent) -> None:
        self.items.append(event)

    def steps(self) -> list[tuple[str, str]]:
        return [(e.step.value, e.kind.label) for e in self.items if e.kind.label != "info"]

    def text(self) -> str:
        return json.dumps([e.message for e in self.items])
