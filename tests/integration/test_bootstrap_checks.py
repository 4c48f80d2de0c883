"""``tetherctl bootstrap`` checks before it connects: an unknown environment or role is refused
before any SSH or SSM connection (the machine's address is a listening socket that must see no
connection), by tetherctl and by the controller's ``AdminService.Bootstrap``; and every run ends
with one line of timings ("Finished in ...").
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import grpc
import pytest

from tests.integration.conftest import apply_env
from tests.integration.harness import BIN, Controller
from tether.controller import wire
from tether.controller.cli.client import connect

pytestmark = pytest.mark.integration


class Listener:
    """A socket that listens and never accepts: the kernel queues any connection, which we see."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    def connections(self) -> int:
        n = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return n
            conn.close()
            n += 1


@pytest.fixture
def machine() -> Iterator[Listener]:
    listener = Listener()
    yield listener
    listener.sock.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    """One controller for the module (with environment ``lab``): no test here changes it."""
    workdir = tmp_path_factory.mktemp("lab")
    c = Controller(workdir)
    c.start()
    apply_env(c, workdir, "lab", "    - name: hello\n      inline: echo hi\n")
    yield c
    c.kill()


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "id_ed25519"
    path.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
    path.chmod(0o600)
    return path


def bootstrap(controller: Controller, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(TETHER_CONFIG=str(controller.config), AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="y")
    return subprocess.run(
        [str(BIN / "tetherctl"), "bootstrap", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_an_unknown_environment_is_refused_before_ssh_or_ssm(
    lab: Controller, machine: Listener, key: Path
) -> None:
    ssh = ["--ssh", f"root@127.0.0.1:{machine.port}", "--identity", str(key), "--accept-new-host-key"]
    ssm = ["--ssm", "i-0123456789abcdef0", "--region", "us-east-1"]
    ssm += ["--ssm-endpoint", f"http://127.0.0.1:{machine.port}"]
    for target in (ssh, [*ssh, "--via-controller"], ssm):
        out = bootstrap(lab, "--env", "nope", *target)
        assert out.returncode == 1, out
        assert "environment 'nope' not found on the controller" in out.stderr, out.stderr
        assert "no machine was contacted" in out.stderr
        assert out.stdout == ""  # no progress, no summary: nothing started
        assert machine.connections() == 0, target


def test_every_unknown_environment_is_named_at_once(
    lab: Controller, machine: Listener, key: Path, tmp_path: Path
) -> None:
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text(
        f"defaults:\n  identity: {key}\n  accept_new_host_key: true\nnodes:\n"
        f"  - {{ssh: 'root@127.0.0.1:{machine.port}', name: a, env: lab}}\n"
        f"  - {{ssh: 'root@127.0.0.2:{machine.port}', name: b, env: gone}}\n"
        f"  - {{ssh: 'root@127.0.0.3:{machine.port}', name: c, env: missing}}\n"
    )
    out = bootstrap(lab, "--inventory", str(inventory))
    assert out.returncode == 1
    assert "environment 'gone' not found on the controller (for b)" in out.stderr
    assert "environment 'missing' not found on the controller (for c)" in out.stderr
    assert "'lab'" not in out.stderr
    assert machine.connections() == 0  # not even the machine of the known environment


def test_an_unknown_role_is_refused_before_ssh(lab: Controller, machine: Listener, key: Path) -> None:
    out = bootstrap(
        lab,
        "--env",
        "lab",
        "--role",
        "boss",
        "--ssh",
        f"root@127.0.0.1:{machine.port}",
        "--identity",
        str(key),
    )
    assert out.returncode == 1
    assert "unknown role 'boss' (expected control-plane or worker)" in out.stderr
    assert machine.connections() == 0


def test_the_controller_refuses_an_unknown_environment_or_role_before_connecting(
    lab: Controller, machine: Listener, key: Path
) -> None:
    stub, _, channel = connect(str(lab.config))
    target = wire.admin.SshTarget(
        host="127.0.0.1", port=machine.port, user="root", private_key=key.read_bytes()
    )
    try:
        for request, code, words in (
            (
                wire.admin.BootstrapRequest(environment="nope", ssh=target),
                grpc.StatusCode.NOT_FOUND,
                "'nope'",
            ),
            (
                wire.admin.BootstrapRequest(environment="lab", role="boss", ssh=target),
                grpc.StatusCode.INVALID_ARGUMENT,
                "unknown role 'boss'",
            ),
        ):
            with pytest.raises(grpc.RpcError) as err:
                list(stub.Bootstrap(request, timeout=30))
            assert err.value.code() == code
            assert words in (err.value.details() or "")
            assert machine.connections() == 0
    finally:
        channel.close()


def test_a_run_ends_with_its_timings(lab: Controller, key: Path) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nobody listens there: the connect fails, quickly
    args = (
        "--env",
        "lab",
        "--ssh",
        f"root@127.0.0.1:{port}",
        "--identity",
        str(key),
        "--accept-new-host-key",
    )
    text = bootstrap(lab, *args)
    assert text.returncode == 1, text
    last = text.stdout.strip().splitlines()[-1]
    slowest = re.escape(f"root@127.0.0.1:{port}")
    expected = rf"Finished with failures in \d+\.\ds: 1 failed \(1 machine; slowest {slowest} \d+\.\ds\)"
    assert re.fullmatch(expected, last), text.stdout
    as_json = bootstrap(lab, *args, "-o", "json")
    assert as_json.returncode == 1
    assert as_json.stdout.lstrip().startswith("[")  # stdout stays JSON; the line goes with the progress
    assert as_json.stderr.strip().splitlines()[-1].startswith("Finished with failures in ")
