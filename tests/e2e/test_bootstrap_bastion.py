"""Issue 14: `tetherctl bootstrap --inventory env.yaml` through a bastion from holodeck's `auth.sshConfig`.

Two testbed nodes: node1 is the bastion, node2 the target. node2's sshd lets logins in only from
node1's address (``AllowUsers root@NODE1``), so the host cannot reach it directly; node1 lets the
bastion user ``tester`` in only with a key of its own (not the node key). From a fresh working
directory with relative paths, as a user would: ``tetherctl env apply -f env.yaml`` (the spec
validator accepts ``sshConfig``), then ``tetherctl bootstrap --inventory env.yaml --known-hosts
./known_hosts``. Proven: with strict host keys (tether's default) an unknown bastion key stops the
run before anything reaches node2; with both keys known, the agent is installed, enrolled and
provisioned on node2, node2's sshd saw the login come from node1's address, node1's sshd saw the
bastion user log in with its own key, nothing was learned into known_hosts, no credential or join
token was printed; a second run changes nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from tests.e2e.testbed.testbed import Testbed
from tests.integration.harness import BIN, Controller, wait_for
from tether.bootstrap.bundle import default_cache_dir
from tether.controller import wire
from tether.controller.cli.client import connect
from tether.controller.cli.output import to_dict

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
TOKEN_RE = re.compile(r"\b[a-z0-9]{6}\.[a-z0-9]{32}\b")
ENV_NAME = "bastion-lab"


@pytest.fixture(scope="module")
def bed(testbed_factory: Callable[..., Testbed]) -> Iterator[Testbed]:
    testbed = testbed_factory(2)
    yield testbed
    assert testbed.down() == []


@pytest.fixture(scope="module")
def controller(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    os.environ.setdefault("TETHER_BUNDLE_CACHE", str(default_cache_dir()))
    c = Controller(tmp_path_factory.mktemp("bastion-controller"), bed.describe()["bridge_ip"])
    c.start()
    yield c
    c.kill()


def ip(bed: Testbed, name: str) -> str:
    return bed.node(name).ip


def lock_down(bed: Testbed, bastion_pub: str) -> None:
    """node2: SSH logins only from node1. node1: the bastion user only with the bastion key."""
    node1 = ip(bed, "node1")
    bed.exec("node2", f"printf 'AllowUsers root@{node1}\\n' > /etc/ssh/sshd_config.d/10-bastion-only.conf")
    bed.exec(
        "node1",
        "install -d -m 755 /etc/ssh/bastion_keys && cat > /etc/ssh/bastion_keys/tester && "
        "chmod 644 /etc/ssh/bastion_keys/tester && printf 'Match User tester\\n"
        "  AuthorizedKeysFile /etc/ssh/bastion_keys/tester\\n' > /etc/ssh/sshd_config.d/zz-bastion-user.conf",
        input=bastion_pub,
    )
    for name in ("node1", "node2"):
        bed.exec(name, "sshd -t && systemctl reload ssh")
    probe = bed.exec("node1", "sshd -T -C user=tester,host=h,addr=10.0.0.1 | grep -i '^authorizedkeysfile'")
    assert "/etc/ssh/bastion_keys/tester" in probe.stdout
    direct = bed.ssh("node2", "true", check=False, timeout=30)  # from the host: refused by node2's sshd
    assert direct.returncode != 0, direct


def environment(bed: Testbed) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "holodeck.nvidia.com/v1alpha1",
            "kind": "Environment",
            "metadata": {"name": ENV_NAME},
            "spec": {
                "provider": "ssh",
                "auth": {
                    "username": "root",
                    "privateKey": "./id_ed25519",
                    "sshConfig": {
                        "bastion": {
                            "host": ip(bed, "node1"),
                            "username": "tester",
                            "privateKey": "./bastion_ed25519",
                        },
                        "knownHostsPolicy": "strict",
                        "connectTimeout": "5s",
                        "handshakeTimeout": "20s",
                        "keepaliveInterval": "15s",
                        "maxRetries": 2,
                    },
                },
                "instance": {"hostUrl": ip(bed, "node2")},
                "customTemplates": [
                    {"name": "hello", "inline": 'echo "provisioned $(hostname)" > /var/tmp/tether-hello\n'}
                ],
            },
        },
        sort_keys=False,
    )


@pytest.fixture(scope="module")
def workdir(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh directory holding what a user would have: the keys, known_hosts and env.yaml."""
    desc = bed.describe()
    work = tmp_path_factory.mktemp("user-workdir")
    shutil.copy(desc["ssh_key"], work / "id_ed25519")
    (work / "id_ed25519").chmod(0o600)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bastion", "-f", str(work / "bastion_ed25519")],
        check=True,
    )
    lock_down(bed, (work / "bastion_ed25519.pub").read_text())
    known = Path(desc["known_hosts"]).read_text()
    (work / "known_hosts").write_text(known)
    node1 = ip(bed, "node1")
    (work / "known_hosts_without_bastion").write_text(
        "".join(line + "\n" for line in known.splitlines() if not line.startswith((f"{node1} ", "node1 ")))
    )
    (work / "env.yaml").write_text(environment(bed))
    return work


def tetherctl(controller: Controller, workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TETHER_CONFIG": str(controller.config)}
    env.pop("SSH_AUTH_SOCK", None)  # the keys in env.yaml, nothing else
    return subprocess.run(
        [str(BIN / "tetherctl"), *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=240
    )


def journal_cursor(bed: Testbed, name: str) -> str:
    out = bed.exec(name, "journalctl -n 0 --show-cursor --no-pager").stdout
    return out.rsplit("-- cursor: ", 1)[1].strip()


def sshd_log(bed: Testbed, name: str, cursor: str) -> str:
    """What sshd logged on ``name`` since ``cursor`` (the logins of this test only)."""
    return bed.exec(
        name, ["journalctl", "-u", "ssh", "--no-pager", "-o", "cat", f"--after-cursor={cursor}"]
    ).stdout


def node_info(controller: Controller, name: str) -> dict[str, Any]:
    stub, _, channel = connect(str(controller.config))
    try:
        return to_dict(stub.GetNode(wire.admin.GetNodeRequest(name=name), timeout=30))
    except grpc.RpcError:
        return {}
    finally:
        channel.close()


def test_bootstrap_through_the_bastion_from_ssh_config(
    bed: Testbed, controller: Controller, workdir: Path
) -> None:
    node1, node2 = ip(bed, "node1"), ip(bed, "node2")
    cursors = {name: journal_cursor(bed, name) for name in ("node1", "node2")}
    applied = tetherctl(controller, workdir, "env", "apply", "-f", "env.yaml")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "sshConfig" in applied.stdout + applied.stderr  # its note: read by the bootstrap only
    bootstrap = ("bootstrap", "--inventory", "env.yaml", "--controller", controller.address, "-o", "json")

    # Strict host keys: the bastion's key is unknown, so nothing goes further than node1's handshake.
    refused = tetherctl(controller, workdir, *bootstrap, "--known-hosts", "./known_hosts_without_bastion")
    assert refused.returncode != 0, refused.stdout + refused.stderr
    said = refused.stdout + refused.stderr
    assert "bastion: unknown host key" in said and node1 in said, said
    assert bed.exec("node2", "test -e /etc/tether", check=False).returncode != 0

    out = tetherctl(controller, workdir, *bootstrap, "--known-hosts", "./known_hosts")
    assert out.returncode == 0, out.stdout + out.stderr
    (result,) = json.loads(out.stdout)
    assert (result["node"], result["outcome"], result["target"]) == (
        "node2",
        "installed",
        f"root@{node2} via tester@{node1}",
    )
    wait_for(
        lambda: bed.exec("node2", "systemctl is-active tether-agent", check=False).stdout.strip() == "active",
        timeout=60,
        what="tether-agent active on node2",
    )
    info = wait_for(
        lambda: (n := node_info(controller, "node2")).get("connected") and n["state"] == "provisioned" and n,
        timeout=90,
        what="node2 enrolled, connected and provisioned",
    )
    assert info["environment"] == ENV_NAME
    assert "provisioned node2" in bed.exec("node2", "cat /var/tmp/tether-hello").stdout

    # The route: node2's sshd saw root come from node1; node1's sshd saw tester with the bastion key.
    node2_log = sshd_log(bed, "node2", cursors["node2"])
    assert re.search(rf"Accepted publickey for root from {re.escape(node1)} ", node2_log), node2_log
    assert not re.search(r"Accepted \S+ for \S+ from (?!" + re.escape(node1) + r" )", node2_log), node2_log
    bastion_fp = subprocess.run(
        ["ssh-keygen", "-lf", str(workdir / "bastion_ed25519.pub")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[1]
    node1_log = sshd_log(bed, "node1", cursors["node1"])
    assert re.search(rf"Accepted publickey for tester from \S+ .*{re.escape(bastion_fp)}", node1_log), (
        node1_log
    )

    # Strict: nothing learned. Nothing secret printed.
    assert (workdir / "known_hosts").read_text() == Path(bed.describe()["known_hosts"]).read_text()
    printed = out.stdout + out.stderr + refused.stdout + refused.stderr + applied.stdout + applied.stderr
    assert not TOKEN_RE.search(printed)
    for key in ("id_ed25519", "bastion_ed25519"):
        body = "".join((workdir / key).read_text().splitlines()[1:-1])
        assert body[:40] not in printed.replace("\n", "")

    again = tetherctl(controller, workdir, *bootstrap, "--known-hosts", "./known_hosts")
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout)[0]["outcome"] == "already-installed"
