"""The SSH transport against real OpenSSH servers on 127.0.0.1: host keys, every way to log in,
jump hosts, and ``tetherctl bootstrap`` end to end up to the point where this host (no systemd
as PID 1) is refused. Needs root (sshd runs in a private mount namespace); skipped otherwise.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.sshd import Sshd, available, free_port, keygen
from tests.integration.conftest import apply_env
from tests.integration.harness import BIN, Controller
from tether.bootstrap import ssh
from tether.bootstrap.errors import AuthenticationError, ConnectError, HostKeyError
from tether.bootstrap.hostkeys import HostKeyPolicy
from tether.nodeagent.secrets import Secret

pytestmark = [pytest.mark.integration, pytest.mark.skipif(bool(available()), reason=available() or "ok")]
ROOT_PASSWORD = "root-pw-canary-5b0c2e71"
PASSPHRASE = "passphrase-canary-93d1aa04"


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    server = Sshd(tmp_path, root_password=ROOT_PASSWORD)
    server.authorize(keygen(tmp_path / "id_plain"))
    server.authorize(keygen(tmp_path / "id_openssh", PASSPHRASE))
    server.authorize(keygen(tmp_path / "id_pem", PASSPHRASE, "rsa", "PEM"))
    server.start()
    yield server
    server.stop()


def target(
    server: Sshd,
    *,
    key: str = "",
    passphrase: str = "",
    password: str = "",
    agent: str = "",
    policy: HostKeyPolicy | None = None,
    user: str = "root",
    jump: ssh.SshEndpoint | None = None,
) -> ssh.SshTarget:
    creds = ssh.SshCredentials(Secret(key), Secret(passphrase), Secret(password), agent)
    pinned = HostKeyPolicy(pinned=server.host_key_line)
    return ssh.SshTarget(ssh.SshEndpoint("127.0.0.1", server.port, user), creds, policy or pinned, jump, 5.0)


async def roundtrip(t: ssh.SshTarget) -> str:
    transport = await ssh.connect(t)
    try:
        result = await transport.run("id -un; cat", stdin=b"through stdin")
        return result.stdout
    finally:
        await transport.close()


async def test_key_password_and_passphrase_protected_keys_all_log_in(sshd: Sshd, tmp_path: Path) -> None:
    plain = (tmp_path / "id_plain").read_text()
    assert await roundtrip(target(sshd, key=plain)) == "root\nthrough stdin"
    assert await roundtrip(target(sshd, password=ROOT_PASSWORD)) == "root\nthrough stdin"
    pem = (tmp_path / "id_pem").read_text()
    assert await roundtrip(target(sshd, key=pem, passphrase=PASSPHRASE)) == "root\nthrough stdin"


@pytest.mark.skipif(
    importlib.util.find_spec("bcrypt") is None, reason="OpenSSH-format encrypted keys need bcrypt"
)
async def test_a_passphrase_protected_openssh_format_key_logs_in(sshd: Sshd, tmp_path: Path) -> None:
    openssh = (tmp_path / "id_openssh").read_text()
    assert await roundtrip(target(sshd, key=openssh, passphrase=PASSPHRASE)) == "root\nthrough stdin"


async def test_wrong_credentials_are_clear_non_retryable_errors(sshd: Sshd, tmp_path: Path) -> None:
    with pytest.raises(AuthenticationError, match=r"authentication failed for root@127\.0\.0\.1") as err:
        await roundtrip(target(sshd, password="not-the-password"))
    assert not err.value.retryable
    pem = (tmp_path / "id_pem").read_text()
    with pytest.raises(AuthenticationError, match="wrong passphrase"):
        await roundtrip(target(sshd, key=pem, passphrase="wrong"))
    with pytest.raises(AuthenticationError, match="passphrase is needed"):
        await roundtrip(target(sshd, key=pem))
    stranger = tmp_path / "id_stranger"
    keygen(stranger)
    with pytest.raises(AuthenticationError):
        await roundtrip(target(sshd, key=stranger.read_text()))


async def test_ssh_agent_logs_in(sshd: Sshd, tmp_path: Path) -> None:
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            await asyncio.sleep(0.05)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", str(tmp_path / "id_plain")], env=env, check=True, capture_output=True)
        assert await roundtrip(target(sshd, agent=str(sock))) == "root\nthrough stdin"
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=10)


async def test_wrong_pinned_key_aborts_during_the_handshake_before_login(sshd: Sshd, tmp_path: Path) -> None:
    other = keygen(tmp_path / "other_host_key")
    with pytest.raises(HostKeyError, match="host key mismatch") as err:
        await roundtrip(target(sshd, password=ROOT_PASSWORD, policy=HostKeyPolicy(pinned=other)))
    assert not err.value.retryable
    log = sshd.wait_log("Host key is not trusted")
    assert "Host key is not trusted" in log and "[preauth]" in log
    assert sshd.sessions() == 0  # no credential was sent, no command ran


async def test_known_hosts_files_and_trust_on_first_use(sshd: Sshd, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    password = ROOT_PASSWORD
    with pytest.raises(HostKeyError, match="unknown host key"):
        await roundtrip(target(sshd, password=password, policy=HostKeyPolicy(known_hosts=(kh,))))
    assert not kh.exists()
    t = target(sshd, password=password, policy=HostKeyPolicy(known_hosts=(kh,), accept_new=True))
    transport = await ssh.connect(t)
    assert transport.learned_host_key == f"[127.0.0.1]:{sshd.port} {sshd.host_key_line}"
    await transport.close()
    assert kh.read_text() == transport.learned_host_key + "\n"
    # Now known: verified without TOFU. A different key for the same host is refused even with TOFU.
    assert await roundtrip(target(sshd, password=password, policy=HostKeyPolicy(known_hosts=(kh,))))
    kh.write_text(f"[127.0.0.1]:{sshd.port} {keygen(tmp_path / 'stale')}\n")
    sessions = sshd.sessions()
    with pytest.raises(HostKeyError, match="CHANGED"):
        await roundtrip(
            target(sshd, password=password, policy=HostKeyPolicy(known_hosts=(kh,), accept_new=True))
        )
    sshd.wait_log("Host key is not trusted")
    assert sshd.sessions() == sessions


async def test_a_jump_host_carries_the_connection(tmp_path: Path) -> None:
    servers = {}
    try:
        public = keygen(tmp_path / "id_hops")  # one key for every hop: the same credentials
        for name, forwarding in (("jump", True), ("closed", False), ("target", True)):
            s = Sshd(tmp_path, name=name, forwarding=forwarding)
            s.authorize(public)
            servers[name] = s.start()
        key = (tmp_path / "id_hops").read_text()
        kh = tmp_path / "known_hosts"
        kh.write_text("".join(f"[127.0.0.1]:{s.port} {s.host_key_line}\n" for s in servers.values()))
        policy = HostKeyPolicy(known_hosts=(kh,))
        via = ssh.SshEndpoint("127.0.0.1", servers["jump"].port, "root")
        t = target(servers["target"], key=key, policy=policy, jump=via)
        assert await roundtrip(t) == "root\nthrough stdin"
        assert servers["jump"].sessions() == 1 and servers["target"].sessions() == 1
        blocked = ssh.SshEndpoint("127.0.0.1", servers["closed"].port, "root")
        with pytest.raises(ConnectError):
            await roundtrip(target(servers["target"], key=key, policy=policy, jump=blocked))
        assert servers["target"].sessions() == 1  # never reached without a working jump
    finally:
        for s in servers.values():
            s.stop()


async def test_a_login_that_cannot_become_root_is_refused_at_connect(tmp_path: Path) -> None:
    server = Sshd(tmp_path, user=("deploy", "deploy-pw-canary-77")).start()
    try:
        t = target(server, password="deploy-pw-canary-77", user="deploy")
        with pytest.raises(ConnectError, match=r"cannot act as root.*passwordless sudo"):
            await ssh.connect(t)
        assert server.sessions() == 1  # it did log in; it stopped before running anything else
    finally:
        server.stop()


def bootstrap_cli(
    controller: Controller, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "TETHER_CONFIG": str(controller.config), **(env or {})}
    return subprocess.run(
        [str(BIN / "tetherctl"), "bootstrap", *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=120,
        check=False,
    )


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    c = Controller(tmp_path)
    c.start()
    apply_env(c, tmp_path, "lab", "    - name: hello\n      inline: echo hi\n")
    yield c
    c.kill()


def test_cli_shows_the_host_then_refuses_it_and_never_prints_a_credential(
    sshd: Sshd, controller: Controller, tmp_path: Path
) -> None:
    endpoint = f"root@127.0.0.1:{sshd.port}"
    env = {"T_PASS": ROOT_PASSWORD, "T_PHRASE": PASSPHRASE}
    runs = [
        bootstrap_cli(
            controller,
            "--env",
            "lab",
            "--ssh",
            endpoint,
            "--password-env",
            "T_PASS",
            "--host-key",
            sshd.host_key_line,
            env=env,
        ),
        bootstrap_cli(
            controller,
            "--env",
            "lab",
            "--role",
            "worker",
            "--ssh",
            endpoint,
            "--identity",
            str(tmp_path / "id_pem"),
            "--passphrase-env",
            "T_PHRASE",
            "--host-key",
            sshd.host_key_line,
            env=env,
        ),
        bootstrap_cli(
            controller,
            "--env",
            "lab",
            "--ssh",
            endpoint,
            "--password-env",
            "T_PASS",
            "--host-key",
            sshd.host_key_line,
            "--via-controller",
            env=env,
        ),
    ]
    for out in runs:
        assert out.returncode == 1, out.stderr
        text = out.stdout + out.stderr
        assert "detect  info      Debian" in out.stdout or "detect  info" in out.stdout
        assert "refused: unsupported host: systemd is not running as PID 1" in out.stdout
        assert "NODE" in out.stdout and "refused" in out.stdout.splitlines()[-2]
        assert out.stdout.splitlines()[-1].startswith("Finished with failures in ")
        assert "loopback address" in out.stderr or "--via-controller" in " ".join(out.args)
        for secret in (ROOT_PASSWORD, PASSPHRASE):
            assert secret not in text
    controller.kill()
    assert ROOT_PASSWORD not in controller.log_path.read_text()
    assert ROOT_PASSWORD not in controller.db_dump()
    assert not Path("/etc/tether/join-token").exists()


def test_cli_wrong_host_key_aborts_before_logging_in(
    sshd: Sshd, controller: Controller, tmp_path: Path
) -> None:
    wrong = keygen(tmp_path / "impostor")
    out = bootstrap_cli(
        controller,
        "--env",
        "lab",
        "--ssh",
        f"root@127.0.0.1:{sshd.port}",
        "--identity",
        str(tmp_path / "id_plain"),
        "--host-key",
        wrong,
    )
    assert out.returncode == 1
    assert "host key mismatch" in out.stdout
    assert "connect failed" in out.stdout
    assert "detect" not in out.stdout
    assert "Host key is not trusted" in sshd.wait_log("Host key is not trusted")
    assert sshd.sessions() == 0


def test_cli_inventory_runs_every_machine_and_summarises(
    sshd: Sshd, controller: Controller, tmp_path: Path
) -> None:
    second = Sshd(tmp_path, name="second")
    second.authorize(Path(f"{tmp_path / 'id_plain'}.pub").read_text())
    second.start()
    try:
        kh = tmp_path / "kh"
        kh.write_text("".join(f"[127.0.0.1]:{s.port} {s.host_key_line}\n" for s in (sshd, second)))
        inventory = tmp_path / "nodes.yaml"
        inventory.write_text(
            f"defaults:\n  env: lab\n  identity: {tmp_path / 'id_plain'}\n  known_hosts: {kh}\nnodes:\n"
            f"  - ssh: root@127.0.0.1:{sshd.port}\n    name: one\n"
            f"  - ssh: root@127.0.0.1:{second.port}\n    name: two\n"
            f"  - ssh: root@127.0.0.1:{free_port()}\n    name: three\n"  # nobody listens there
        )
        out = bootstrap_cli(controller, "--inventory", str(inventory), "--concurrency", "2", "-o", "json")
        assert out.returncode == 1
        results = {r["node"] or r["target"]: r for r in json.loads(out.stdout)}
        assert results["one"]["outcome"] == results["two"]["outcome"] == "refused"
        three = next(r for k, r in results.items() if k not in ("one", "two"))
        assert three["outcome"] == "failed" and three["retryable"]
        assert "cannot reach" in three["message"]
    finally:
        second.stop()


def test_cli_known_hosts_and_trust_on_first_use_flags(
    sshd: Sshd, controller: Controller, tmp_path: Path
) -> None:
    endpoint = f"root@127.0.0.1:{sshd.port}"
    kh = tmp_path / "cli_known_hosts"
    login = ("--env", "lab", "--ssh", endpoint, "--identity", str(tmp_path / "id_plain"))

    unknown = bootstrap_cli(controller, *login, "--known-hosts", str(kh))
    assert unknown.returncode == 1 and "unknown host key" in unknown.stdout and "detect" not in unknown.stdout
    assert not kh.exists()

    learned = bootstrap_cli(controller, *login, "--known-hosts", str(kh), "--accept-new-host-key")
    assert "detect" in learned.stdout  # past the handshake (this host is then refused: no systemd)
    assert kh.read_text() == f"[127.0.0.1]:{sshd.port} {sshd.host_key_line}\n"

    known = bootstrap_cli(controller, *login, "--known-hosts", str(kh))  # verified, no TOFU this time
    assert "detect" in known.stdout and "unknown host key" not in known.stdout

    both = bootstrap_cli(controller, *login, "--host-key", sshd.host_key_line, "--known-hosts", str(kh))
    assert both.returncode != 0 and "--host-key" in both.stderr
    assert sshd.sessions() >= 2
