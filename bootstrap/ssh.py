"""The SSH transport (asyncssh): key (optionally passphrase-protected), password or ssh-agent;
any port; an optional jump host (a bastion: asyncssh's ``tunnel``, with its own credentials when
given); host keys verified as ``tether.bootstrap.hostkeys`` describes, the jump host's by the same
policy (never the target's pin). Timeouts, keepalives and connection attempts are the target's
(holodeck's ``auth.sshConfig``, see ``tether.bootstrap.sshconfig``).

Commands run through ``/bin/sh -c`` and, for a login other than root, ``sudo -n`` (passwordless
sudo is required; the connect step checks it before anything else happens). Credentials are
``Secret`` values used for the handshake only; nothing here stores or prints them. The user's
``~/.ssh/config`` is deliberately not read: what the operator typed is what is dialled.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

import asyncssh

from tether.bootstrap.errors import AuthenticationError, CommandTimeout, ConnectError, HostKeyError
from tether.bootstrap.hostkeys import HostKeyPolicy, HostKeyVerifier
from tether.bootstrap.transport import DEFAULT_TIMEOUT, CommandResult, Transport, write_stdin_script
from tether.nodeagent.secrets import Secret

DEFAULT_PORT = 22
CONNECT_TIMEOUT = 15.0
HANDSHAKE_TIMEOUT = 15.0  # holodeck's default handshakeTimeout
KEEPALIVE_SECONDS = 30.0
RETRY_DELAY = 1.0  # between connection attempts (holodeck: fixed 1 s)
_ENDPOINT_RE = re.compile(r"(?:(?P<user>[^@\s]+)@)?(?P<host>\[[^\]]+\]|[^:@\s]+)(?::(?P<port>[0-9]+))?")


@dataclass(frozen=True)
class SshEndpoint:
    host: str
    port: int = DEFAULT_PORT
    user: str = "root"

    @classmethod
    def parse(cls, value: str, default_user: str = "root") -> SshEndpoint:
        """``[USER@]HOST[:PORT]`` (an IPv6 host in brackets)."""
        m = _ENDPOINT_RE.fullmatch(value.strip())
        if not m:
            raise ValueError(f"invalid SSH target {value!r}: expected USER@HOST[:PORT]")
        port = int(m.group("port") or DEFAULT_PORT)
        if not 0 < port < 65536:
            raise ValueError(f"invalid SSH port in {value!r}")
        return cls(m.group("host").strip("[]"), port, m.group("user") or default_user)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user}@{host}" + (f":{self.port}" if self.port != DEFAULT_PORT else "")


@dataclass(frozen=True)
class SshCredentials:
    """How to log in. Every field that is a credential is a ``Secret``."""

    private_key: Secret = field(default_factory=lambda: Secret(""))  # OpenSSH/PEM text
    passphrase: Secret = field(default_factory=lambda: Secret(""))
    password: Secret = field(default_factory=lambda: Secret(""))
    agent_path: str = ""  # an ssh-agent socket ($SSH_AUTH_SOCK)

    def secrets(self) -> tuple[Secret, ...]:
        return (self.private_key, self.passphrase, self.password)

    def describe(self) -> str:
        ways = []
        if self.private_key:
            ways.append("key" + (" (passphrase)" if self.passphrase else ""))
        if self.password:
            ways.append("password")
        if self.agent_path:
            ways.append("ssh-agent")
        return ", ".join(ways) or "none"


@dataclass(frozen=True)
class SshTarget:
    endpoint: SshEndpoint
    credentials: SshCredentials
    host_keys: HostKeyPolicy = field(default_factory=HostKeyPolicy)
    jump: SshEndpoint | None = None  # logs in with jump_credentials, else the same credentials
    connect_timeout: float = CONNECT_TIMEOUT  # alone: bounds TCP connect, handshake and login together
    jump_credentials: SshCredentials | None = None
    handshake_timeout: float | None = None  # given: connect_timeout is the TCP connect's share only
    keepalive_interval: float = KEEPALIVE_SECONDS
    attempts: int = 1  # connection attempts (holodeck's maxRetries), RETRY_DELAY apart

    def __str__(self) -> str:
        return str(self.endpoint) + (f" via {self.jump}" if self.jump else "")

    def timeouts(self) -> tuple[float, float]:
        """asyncssh's (connect_timeout, login_timeout): the whole connection, and its SSH part."""
        if self.handshake_timeout is None:
            return self.connect_timeout, self.connect_timeout
        return self.connect_timeout + self.handshake_timeout, self.handshake_timeout


class _Client(asyncssh.SSHClient):
    def __init__(self, verifier: HostKeyVerifier) -> None:
        self._verifier = verifier

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        return self._verifier.validate(host, addr, port, key)


def _client_keys(credentials: SshCredentials) -> list[asyncssh.SSHKey]:
    if not credentials.private_key:
        return []
    try:
        key = asyncssh.import_private_key(
            credentials.private_key.reveal(), credentials.passphrase.reveal() or None
        )
    except asyncssh.KeyEncryptionError as exc:
        if "bcrypt" in str(exc):
            raise AuthenticationError(
                "a passphrase-protected OpenSSH key needs the Python package bcrypt (pip install bcrypt)"
            ) from None
        raise AuthenticationError("cannot decrypt the private key: wrong passphrase") from None
    except asyncssh.KeyImportError as exc:
        text = str(exc)
        if credentials.passphrase and "decrypt" in text.lower():
            raise AuthenticationError("cannot decrypt the private key: wrong passphrase") from None
        if "passphrase" in text.lower():
            raise AuthenticationError("the private key is encrypted: a passphrase is needed") from None
        raise AuthenticationError(f"cannot load the private key: {text}") from None
    return [key]


def client_options(
    target: SshTarget,
    endpoint: SshEndpoint,
    credentials: SshCredentials,
    verifier: HostKeyVerifier,
    tunnel: asyncssh.SSHClientConnection | None = None,
) -> dict[str, Any]:
    """The keyword arguments of ``asyncssh.connect`` for one hop (the target's or the jump host's)."""
    connect_timeout, login_timeout = target.timeouts()
    options: dict[str, Any] = {
        "port": endpoint.port,
        "username": endpoint.user,
        "known_hosts": verifier.known_hosts,
        "client_factory": lambda: _Client(verifier),
        "client_keys": _client_keys(credentials),
        "password": credentials.password.reveal() or None,
        "agent_path": credentials.agent_path or None,
        "config": [],
        "x509_trusted_certs": None,
        "connect_timeout": connect_timeout,
        "login_timeout": login_timeout,
        "keepalive_interval": target.keepalive_interval,
        "keepalive_count_max": 4,
        "kbdint_auth": False,
        "gss_auth": False,
    }
    if tunnel is not None:
        options["tunnel"] = tunnel
    return options


async def _dial(
    target: SshTarget,
    endpoint: SshEndpoint,
    credentials: SshCredentials,
    policy: HostKeyPolicy,
    tunnel: asyncssh.SSHClientConnection | None = None,
    label: str = "",
) -> asyncssh.SSHClientConnection:
    """One connection, tried ``target.attempts`` times while it fails to connect (never on a
    refused host key or login: those do not get better)."""
    for attempt in range(1, max(1, target.attempts) + 1):
        try:
            return await _dial_once(target, endpoint, credentials, policy, tunnel, label)
        except ConnectError as exc:
            if not exc.retryable or attempt >= target.attempts:
                raise
        await asyncio.sleep(RETRY_DELAY)
    raise AssertionError("unreachable")


async def _dial_once(
    target: SshTarget,
    endpoint: SshEndpoint,
    credentials: SshCredentials,
    policy: HostKeyPolicy,
    tunnel: asyncssh.SSHClientConnection | None,
    label: str,
) -> asyncssh.SSHClientConnection:
    verifier = HostKeyVerifier(policy, endpoint.host, endpoint.port)
    options = client_options(target, endpoint, credentials, verifier, tunnel)
    where = label + str(endpoint)
    try:
        conn = await asyncssh.connect(endpoint.host, **options)
    except asyncssh.HostKeyNotVerifiable:
        problem = verifier.problem or f"host key of {endpoint} not verified"
        message = f"{label.strip()}: {problem}" if label else problem
        raise HostKeyError(message, target=str(endpoint)) from None
    except asyncssh.PermissionDenied:
        raise AuthenticationError(
            f"authentication failed for {where} (tried: {credentials.describe()})", target=str(endpoint)
        ) from None
    except (OSError, asyncio.TimeoutError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ConnectError(f"cannot reach {where}: {reason}", target=str(endpoint)) from None
    except (asyncssh.Error, asyncssh.ChannelOpenError) as exc:
        raise ConnectError(f"SSH to {where} failed: {exc.reason}", target=str(endpoint)) from None
    if verifier.learned:
        conn.set_extra_info(tether_learned_host_key=verifier.learned)
    return conn


async def connect(target: SshTarget) -> SshTransport:
    """Dial (through the jump host if any), then make sure commands can run as root."""
    if not any((target.credentials.private_key, target.credentials.password, target.credentials.agent_path)):
        raise AuthenticationError(
            "no SSH credentials: give a key, a password or an ssh-agent", target=str(target)
        )
    jump_conn = None
    if target.jump is not None:
        jump_conn = await _dial(
            target,
            target.jump,
            target.jump_credentials or target.credentials,
            target.host_keys.without_pin(),
            label="bastion ",
        )
    try:
        conn = await _dial(target, target.endpoint, target.credentials, target.host_keys, jump_conn)
    except BaseException:
        if jump_conn is not None:
            jump_conn.close()
        raise
    transport = SshTransport(target, conn, jump_conn)
    try:
        await transport.ensure_root()
    except BaseException:
        await transport.close()
        raise
    return transport


class SshTransport(Transport):
    kind = "ssh"
    confidential_input = True

    def __init__(
        self,
        target: SshTarget,
        conn: asyncssh.SSHClientConnection,
        jump: asyncssh.SSHClientConnection | None = None,
    ) -> None:
        super().__init__(str(target.endpoint))
        self._conn = conn
        self._jump = jump
        self._sudo = target.endpoint.user != "root"
        learned = conn.get_extra_info("tether_learned_host_key", "")
        self.learned_host_key: str = str(learned or "")

    def _wrap(self, command: str) -> str:
        shell = f"/bin/sh -c {shlex.quote(command)}"
        return f"sudo -n -- {shell}" if self._sudo else shell

    async def ensure_root(self) -> None:
        result = await self.run("id -u", timeout=30)
        if result.ok and result.stdout.strip() == "0":
            return
        raise ConnectError(
            f"logged in to {self.target}, but cannot act as root"
            + (" (sudo -n failed: passwordless sudo is required)" if self._sudo else ""),
            target=self.target,
        )

    async def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> CommandResult:
        try:
            proc = await self._conn.run(
                self._wrap(command), input=stdin or b"", encoding=None, timeout=timeout, check=False
            )
        except asyncssh.TimeoutError:
            raise CommandTimeout(
                f"a command on {self.target} ran past {timeout:.0f}s", target=self.target
            ) from None
        except (asyncssh.Error, asyncssh.ChannelOpenError, OSError) as exc:
            reason = getattr(exc, "reason", "") or str(exc) or type(exc).__name__
            raise ConnectError(
                f"lost the SSH session to {self.target}: {reason}", target=self.target
            ) from None
        code = proc.exit_status
        if code is None or code < 0:
            code = 128 + (proc.returncode * -1 if proc.returncode and proc.returncode < 0 else 1)
        return CommandResult(code, _text(proc.stdout), _text(proc.stderr))

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        await self.check(f"writing {path}", write_stdin_script(path, mode), stdin=data)

    async def close(self) -> None:
        for conn in (self._conn, self._jump):
            if conn is not None:
                conn.close()
                with contextlib.suppress(Exception):
                    await conn.wait_closed()
        self._jump = None


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value or "")
