"""Issue 5's "done means", on real systemd nodes over real SSH (and SSM through the test endpoint).

A real controller listens on the testbed bridge (free port); ``tetherctl bootstrap`` adopts the
nodes. Proven here: three nodes bootstrapped concurrently end up with ``tether-agent`` active under
systemd, enrolled and provisioned; a second run changes nothing; a wrong host key aborts before
anything is written; password (a sudo user) and passphrase-protected keys work; after
``systemctl restart`` and a reboot the agent comes back by itself with the same identity;
``--force`` reinstalls and keeps the identity; an SSM-only node is adopted the same way (the
commands really run on the node) both from tetherctl and through ``AdminService.Bootstrap``; the
join token, passwords and passphrases never appear in output, events, logs or stores (canaries).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from tests.e2e.testbed.testbed import Testbed
from tests.fakes.ssm_endpoint import SsmEndpoint, argv_executor
from tests.integration.harness import BIN, Controller, wait_for
from tether.bootstrap import ssh
from tether.bootstrap.bundle import BundleBuilder, default_cache_dir
from tether.bootstrap.delivery import Push
from tether.bootstrap.events import BootstrapEvent, Outcome
from tether.bootstrap.hostkeys import HostKeyPolicy
from tether.bootstrap.install import Request, adopt
from tether.bootstrap.registry import JoinToken
from tether.bootstrap.transport import Transport
from tether.controller import wire
from tether.controller.adminconf import AdminConfig
from tether.controller.cli.bootstrap_admin import AdminRegistry, aio_channel
from tether.controller.cli.client import connect
from tether.controller.cli.output import to_dict
from tether.nodeagent.secrets import Redactor, Secret

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
TOKEN_RE = re.compile(r"\b[a-z0-9]{6}\.[a-z0-9]{32}\b")  # any join token, whoever made it
PASSPHRASE = "e2e-passphrase-canary-1f4d9a"
ENV_TEMPLATE = """\
    - name: hello
      inline: |
        echo "provisioned $(hostname)" > /var/tmp/tether-hello
        echo "hello from $(hostname)"
"""
NODE_STATE = "/etc/tether /opt/tether /var/lib/tether/bootstrap.json /etc/systemd/system/tether-agent.service"


@dataclass
class Surfaces:
    """Everything the bootstrap printed or emitted in this module, for the canary checks."""

    texts: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, text: str) -> None:
        self.texts[f"{name}#{len(self.texts)}"] = text


@pytest.fixture(scope="module")
def bed(testbed_factory: Callable[..., Testbed]) -> Iterator[Testbed]:
    testbed = testbed_factory(6)
    yield testbed
    assert testbed.down() == []


@pytest.fixture(scope="module")
def aws(bed: Testbed) -> Iterator[None]:
    saved = {
        k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "TETHER_BUNDLE_CACHE")
    }
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        TETHER_BUNDLE_CACHE=str(default_cache_dir()),
    )
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def controller(bed: Testbed, aws: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    workdir = tmp_path_factory.mktemp("bootstrap-e2e")
    c = Controller(workdir, bed.describe()["bridge_ip"])  # on the testbed bridge, not loopback
    c.start()
    doc = workdir / "lab.yaml"
    doc.write_text(
        "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata:\n  name: lab\n"
        f"spec:\n  customTemplates:\n{ENV_TEMPLATE}"
    )
    c.ctl("env", "apply", "-f", str(doc))
    yield c
    c.kill()


@pytest.fixture(scope="module")
def surfaces() -> Surfaces:
    return Surfaces()


def cli(
    controller: Controller, surfaces: Surfaces, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "TETHER_CONFIG": str(controller.config), **(env or {})}
    argv = [str(BIN / "tetherctl"), "bootstrap", "--controller", controller.address, *args]
    out = subprocess.run(argv, capture_output=True, text=True, env=full, timeout=280, check=False)
    surfaces.add("tetherctl output", out.stdout + out.stderr)
    return out


def node_info(controller: Controller, name: str) -> dict[str, Any]:
    """The controller's full record of a node (GetNode), certificate fingerprint included."""
    stub, _, channel = connect(str(controller.config))
    try:
        return to_dict(stub.GetNode(wire.admin.GetNodeRequest(name=name), timeout=30))
    finally:
        channel.close()


def state_digest(bed: Testbed, name: str) -> str:
    """Contents, modes and mtimes of everything the bootstrap installs (identity files included)."""
    script = (
        f"find {NODE_STATE} /var/lib/tether/key.pem /var/lib/tether/cert.pem -xdev "
        "-printf '%p %m %T@\\n' 2>/dev/null | sort; "
        f"find {NODE_STATE} -xdev -type f -exec sha256sum {{}} + 2>/dev/null | sort"
    )
    return bed.exec(name, script).stdout


def node_info_or_empty(controller: Controller, name: str) -> dict[str, Any]:
    """node_info, or {} while the controller cannot answer (for retry loops)."""
    try:
        return node_info(controller, name)
    except grpc.RpcError:
        return {}


def assert_agent_running(bed: Testbed, controller: Controller, name: str) -> dict[str, Any]:
    wait_for(
        lambda: bed.exec(name, "systemctl is-active tether-agent", check=False).stdout.strip() == "active",
        timeout=60,
        interval=0.5,
        what=f"tether-agent active on {name}",
    )
    assert bed.exec(name, "systemctl is-enabled tether-agent").stdout.strip() == "enabled"
    return wait_for(
        lambda: (
            (n := node_info_or_empty(controller, name)).get("connected") and n["state"] == "provisioned" and n
        ),
        timeout=60,
        what=f"{name} connected and provisioned",
    )


@pytest.fixture(scope="module")
def three(
    bed: Testbed, controller: Controller, surfaces: Surfaces, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """node1..node3 adopted concurrently from an inventory over real SSH (the other tests build on it)."""
    desc = bed.describe()
    workdir = tmp_path_factory.mktemp("inventory")
    inventory = workdir / "nodes.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "defaults": {
                    "env": "lab",
                    "role": "worker",
                    "identity": desc["ssh_key"],
                    "known_hosts": desc["known_hosts"],
                },
                "nodes": [{"ssh": f"root@{n['ip']}", "name": n["name"]} for n in desc["nodes"][:3]],
            }
        )
    )
    started = time.monotonic()
    out = cli(controller, surfaces, "--inventory", str(inventory), "--concurrency", "3", "-o", "json")
    seconds = time.monotonic() - started
    assert out.returncode == 0, out.stdout + out.stderr
    return {"results": json.loads(out.stdout), "seconds": seconds, "inventory": inventory, "log": out.stderr}


def test_three_nodes_bootstrapped_concurrently_run_the_agent_enrolled_and_provisioned(
    bed: Testbed, controller: Controller, three: dict[str, Any]
) -> None:
    assert sorted(r["node"] for r in three["results"]) == ["node1", "node2", "node3"]
    assert {r["outcome"] for r in three["results"]} == {"installed"}
    print(
        f"\nbootstrap of 3 nodes concurrently: {three['seconds']:.1f}s "
        f"(per node: {', '.join(str(r['seconds']) for r in three['results'])})"
    )
    for name in ("node1", "node2", "node3"):
        info = assert_agent_running(bed, controller, name)
        assert info["environment"] == "lab" and info["role"] == "worker"
        assert bed.exec(name, "cat /var/tmp/tether-hello").stdout.strip() == f"provisioned {name}"
        status = bed.exec(
            name, "systemctl show tether-agent -p Type -p Restart -p WatchdogUSec -p StatusText"
        ).stdout
        assert "Type=notify" in status and "Restart=always" in status and "WatchdogUSec=2min" in status
        assert "StatusText=streaming" in status
        listing = bed.exec(
            name, "stat -c '%n %a %U' /etc/tether /etc/tether/agent.yaml /var/lib/tether"
        ).stdout
        assert listing.split("\n")[:3] == [
            "/etc/tether 700 root",
            "/etc/tether/agent.yaml 600 root",
            "/var/lib/tether 700 root",
        ]
        assert bed.exec(name, "test -e /etc/tether/join-token", check=False).returncode != 0  # spent, removed
        marker = json.loads(bed.exec(name, "cat /var/lib/tether/bootstrap.json").stdout)
        assert marker["state"] == "installed" and marker["node_name"] == name
        assert marker["cert_fingerprint"] == info["cert_fingerprint"]


def test_a_second_run_reports_already_installed_and_changes_nothing(
    bed: Testbed, controller: Controller, three: dict[str, Any], surfaces: Surfaces
) -> None:
    before = {n: state_digest(bed, n) for n in ("node1", "node2", "node3")}
    tokens_before = controller.ctl("token", "list", "--env", "lab", "-o", "json").stdout
    enrolled = {n: node_info(controller, n)["enrolled_ms"] for n in ("node1", "node2", "node3")}
    out = cli(
        controller, surfaces, "--inventory", str(three["inventory"]), "--concurrency", "3", "-o", "json"
    )
    assert out.returncode == 0, out.stderr
    assert {r["outcome"] for r in json.loads(out.stdout)} == {"already-installed"}
    assert "prereqs skipped   already installed" in out.stderr and "agent   skipped" in out.stderr
    for name in ("node1", "node2", "node3"):
        assert state_digest(bed, name) == before[name]
        assert node_info(controller, name)["enrolled_ms"] == enrolled[name]  # never enrolled twice
    assert (
        controller.ctl("token", "list", "--env", "lab", "-o", "json").stdout == tokens_before
    )  # no new token


def test_after_restart_reboot_and_force_the_agent_is_back_with_the_same_identity(
    bed: Testbed, controller: Controller, three: dict[str, Any], surfaces: Surfaces
) -> None:
    name = "node1"
    key = bed.exec(name, "sha256sum /var/lib/tether/key.pem").stdout
    first = node_info(controller, name)
    pid = bed.exec(name, "systemctl show -p MainPID --value tether-agent").stdout.strip()
    bed.exec(name, "systemctl restart tether-agent")
    info = assert_agent_running(bed, controller, name)
    assert bed.exec(name, "systemctl show -p MainPID --value tether-agent").stdout.strip() != pid
    bed.exec(
        name, f"kill -9 {bed.exec(name, 'systemctl show -p MainPID --value tether-agent').stdout.strip()}"
    )
    wait_for(
        lambda: (
            bed.exec(name, "systemctl is-active tether-agent", check=False).stdout.strip() == "active"
            and bed.exec(name, "systemctl show -p NRestarts --value tether-agent").stdout.strip() != "0"
        ),
        timeout=60,
        what="systemd restarting a killed agent",
    )
    bed.reboot(name)
    info = assert_agent_running(bed, controller, name)
    out = cli(
        controller,
        surfaces,
        "--env",
        "lab",
        "--ssh",
        f"root@{bed.node(name).ip}",
        "--identity",
        bed.describe()["ssh_key"],
        "--host-key",
        bed.node(name).host_key,
        "--force",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "reinstalled" in out.stdout and "identity kept, no join token needed" in out.stdout
    info = assert_agent_running(bed, controller, name)
    assert bed.exec(name, "sha256sum /var/lib/tether/key.pem").stdout == key
    assert info["enrolled_ms"] == first["enrolled_ms"]
    assert info["cert_fingerprint"] in (
        first["cert_fingerprint"],
        node_info(controller, name)["cert_fingerprint"],
    )
    journal = bed.exec(name, "journalctl -u tether-agent --no-pager -o cat").stdout
    assert journal.count('"event": "enrolled"') == 1  # once, in all of its lives
    surfaces.add(f"{name} journal", journal)


def test_a_wrong_host_key_aborts_before_anything_is_written_then_a_sudo_user_with_a_password_works(
    bed: Testbed, controller: Controller, surfaces: Surfaces
) -> None:
    name, desc = "node4", bed.describe()
    node = bed.node(name)
    impostor = bed.node("node5").host_key  # a real key, just not this machine's
    login = ["--env", "lab", "--ssh", f"{desc['user']['name']}@{node.ip}", "--password-env", "T_PW"]
    env = {"T_PW": desc["user"]["password"]}
    wrong = cli(controller, surfaces, *login, "--host-key", impostor, env=env)
    assert wrong.returncode == 1
    assert "host key mismatch" in wrong.stdout and "refused" in wrong.stdout
    assert bed.exec(name, f"ls -d {NODE_STATE} /var/lib/tether 2>/dev/null", check=False).stdout == ""
    auth_log = bed.exec(name, "journalctl -u ssh --no-pager -o cat").stdout
    assert "Accepted password" not in auth_log  # never logged in: nothing could have run
    started = time.monotonic()
    right = cli(controller, surfaces, *login, "--host-key", node.host_key, env=env)
    assert right.returncode == 0, right.stdout + right.stderr
    assert "installed" in right.stdout
    print(f"\nbootstrap over password + sudo: {time.monotonic() - started:.1f}s")
    assert_agent_running(bed, controller, name)
    assert "Accepted password for tester" in bed.exec(name, "journalctl -u ssh --no-pager -o cat").stdout


def test_a_passphrase_protected_key_works_and_the_join_token_never_leaks(
    bed: Testbed, controller: Controller, surfaces: Surfaces, tmp_path: Path
) -> None:
    """In-process, so the test knows the exact join token the run creates (the canary)."""
    name = "node5"
    key = tmp_path / "id_pp"
    # OpenSSH's own key format needs bcrypt to decrypt; without it, the legacy PEM format is used.
    fmt = ["-t", "ed25519"] if importlib.util.find_spec("bcrypt") else ["-t", "ecdsa", "-m", "PEM"]
    subprocess.run(["ssh-keygen", "-q", *fmt, "-N", PASSPHRASE, "-f", str(key)], check=True)
    bed.exec(name, "cat >> /root/.ssh/authorized_keys2", input=Path(f"{key}.pub").read_text())
    conf = AdminConfig.read(controller.config)
    created: list[JoinToken] = []
    events: list[BootstrapEvent] = []

    class Recording(AdminRegistry):
        async def create_token(self, **kw: Any) -> JoinToken:
            token = await super().create_token(**kw)
            created.append(token)
            return token

    async def run() -> Any:
        channel = aio_channel(conf)
        target = ssh.SshTarget(
            ssh.SshEndpoint(bed.node(name).ip),
            ssh.SshCredentials(Secret(key.read_text()), Secret(PASSPHRASE)),
            HostKeyPolicy(pinned=bed.node(name).host_key),
        )

        async def opener() -> Transport:
            return await ssh.connect(target)

        try:
            return await adopt(
                opener,
                str(target),
                Request("lab", "worker", controller.address),
                registry=Recording(wire.AdminServiceStub(channel), conf.ca_hash),
                bundles=BundleBuilder(),
                delivery=Push(),
                sink=events.append,
                redactor=Redactor([PASSPHRASE]),
            )
        finally:
            await channel.close()

    result = asyncio.run(run())
    assert result.outcome is Outcome.INSTALLED, result.message
    assert_agent_running(bed, controller, name)
    [token] = created
    secret = token.token.reveal()
    controller.kill(signal.SIGTERM)
    try:
        shown = {
            "events": json.dumps([e.message for e in events]),
            "result": repr(result) + result.message,
            "controller log": controller.log_path.read_text(),
            "controller db": controller.db_dump(),
            "agent journal": bed.exec(name, "journalctl -u tether-agent --no-pager -o cat").stdout,
            "node files": bed.exec(
                name, "grep -rl . /etc/tether /var/lib/tether /opt/tether/bin || true"
            ).stdout,
            "node tether files": bed.exec(name, "cat /etc/tether/* /var/lib/tether/*.json").stdout,
            **surfaces.texts,
        }
    finally:
        controller.start(controller.port)
    assert bed.exec(name, "test -e /etc/tether/join-token", check=False).returncode != 0
    for where, text in shown.items():
        for canary in (secret, secret.split(".")[1], PASSPHRASE, bed.describe()["user"]["password"]):
            assert canary not in text, f"a secret leaked into the {where}"
    assert token.token_id in shown["events"]  # the public id is shown; that is fine


def test_an_ssm_only_node_is_adopted_the_same_way(
    bed: Testbed, controller: Controller, surfaces: Surfaces
) -> None:
    """The SSM endpoint really runs each command inside node6 (nsenter): no SSH involved at all."""
    name, instance = "node6", "i-0e2e000000000006"
    endpoint = SsmEndpoint(argv_executor(lambda _i: bed.exec_argv(name, ["/bin/sh", "-c"])), [instance])
    endpoint.start()
    try:
        args = ["--env", "lab", "--ssm", instance, "--region", "us-east-1", "--ssm-endpoint", endpoint.url]
        started = time.monotonic()
        out = cli(controller, surfaces, *args, "--serve-bundle", bed.describe()["bridge_ip"])
        assert out.returncode == 0, out.stdout + out.stderr
        print(f"\nbootstrap over SSM: {time.monotonic() - started:.1f}s, {len(endpoint.sent)} commands")
        assert "installed" in out.stdout and "the node downloads the bundle" in out.stdout
        info = assert_agent_running(bed, controller, name)
        assert info["name"] == name
        # Through the controller (AdminService.Bootstrap): the same machine is recognised, nothing changes.
        again = cli(controller, surfaces, *args, "--via-controller")
        assert again.returncode == 0, again.stdout + again.stderr
        assert "already-installed" in again.stdout
        history = json.dumps(endpoint.sent)
        assert not TOKEN_RE.search(history)  # the join token travelled sealed, never in a command
        assert "join-token" in history  # ...though it was written (sealed) through one
        surfaces.add("ssm command history", history)
    finally:
        endpoint.stop()


def test_through_the_controller_a_fresh_ssm_node_downloads_the_bundle_from_the_controller(
    bed: Testbed, controller: Controller, surfaces: Surfaces
) -> None:
    name, instance = "node4", "i-0e2e000000000004"  # node4 again, wiped first: the revoked name re-enrolls
    bed.exec(
        name,
        "systemctl disable --now tether-agent && rm -rf /etc/tether /var/lib/tether /opt/tether "
        "/etc/systemd/system/tether-agent.service && systemctl daemon-reload",
    )
    controller.ctl("node", "revoke", name)
    endpoint = SsmEndpoint(argv_executor(lambda _i: bed.exec_argv(name, ["/bin/sh", "-c"])), [instance])
    endpoint.start()
    try:
        out = cli(
            controller,
            surfaces,
            "--env",
            "lab",
            "--ssm",
            instance,
            "--region",
            "us-east-1",
            "--ssm-endpoint",
            endpoint.url,
            "--via-controller",
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "downloaded from the controller" in out.stdout
        assert_agent_running(bed, controller, name)
        assert not TOKEN_RE.search(json.dumps(endpoint.sent))
    finally:
        endpoint.stop()


def test_no_join_token_appears_in_any_output_of_this_module(surfaces: Surfaces) -> None:
    """Runs last: every tetherctl output, journal and SSM history collected above, searched for any token."""
    assert len(surfaces.texts) >= 8
    for where, text in surfaces.texts.items():
        assert not TOKEN_RE.search(text), f"a join token appears in {where}"
