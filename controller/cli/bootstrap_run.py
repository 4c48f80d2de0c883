"""The work behind ``tetherctl bootstrap`` (imported only when the command runs).

Secrets never go on the command line: passwords and key passphrases come from environment
variables named by ``--password-env``/``--passphrase-env``, or from a prompt on the terminal.
Every credential and every join token is masked in all output (``PROCESS_REDACTOR``).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import ipaddress
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh

from tether.bootstrap import inventory, ssh, ssm
from tether.bootstrap.bundle import BundleBuilder, PipWheels
from tether.bootstrap.bundle_http import BundleServer
from tether.bootstrap.delivery import Delivery, Push, S3Presigned, Served
from tether.bootstrap.errors import BootstrapError
from tether.bootstrap.finished import finished_line
from tether.bootstrap.fleet import Machine, adopt_all
from tether.bootstrap.hostkeys import decide_mode, policy_for
from tether.bootstrap.install import Request, Result
from tether.bootstrap.inventory import Entry
from tether.bootstrap.progress import Progress, summary
from tether.bootstrap.transport import Transport
from tether.controller import wire
from tether.controller.adminconf import AdminConfig
from tether.controller.cli.bootstrap_admin import AdminRegistry, aio_channel, remote_adopt
from tether.controller.cli.bootstrap_checks import check_with_controller
from tether.controller.cli.client import CliError, load_config
from tether.nodeagent import logs
from tether.nodeagent.controllers import split_addresses
from tether.nodeagent.identity import split_address
from tether.nodeagent.secrets import PROCESS_REDACTOR, Redactor, Secret


def main(args: argparse.Namespace) -> int:
    logs.configure("warning")  # library logs (asyncssh, botocore) through the redacting filter
    return asyncio.run(_main(args))


@dataclass
class _Secrets:
    """Credentials read once per run, keyed by where they came from; all Secret, all redacted."""

    redactor: Redactor = field(default_factory=Redactor)
    keys: dict[str, tuple[Secret, Secret]] = field(default_factory=dict)
    password: Secret = field(default_factory=lambda: Secret(""))

    def add(self, secret: Secret) -> Secret:
        self.redactor.add(secret)
        PROCESS_REDACTOR.add(secret)
        return secret

    def key(self, path: str, passphrase_env: str) -> tuple[Secret, Secret]:
        if path not in self.keys:
            try:
                text = Path(path).expanduser().read_text()
            except OSError as exc:
                raise CliError(f"cannot read the key {path}: {exc.strerror}") from None
            passphrase = Secret("")
            if passphrase_env:
                passphrase = Secret(_from_env(passphrase_env, "passphrase"))
            elif _encrypted(text):
                passphrase = Secret(_prompt(f"passphrase for {path}: ", f"the key {path} is encrypted"))
            self.keys[path] = (self.add(Secret(text)), self.add(passphrase))
        return self.keys[path]


def _from_env(var: str, what: str) -> str:
    value = os.environ.get(var, "")
    if not value:
        raise CliError(f"the {what} variable {var} is not set")
    return value


def _prompt(prompt: str, why: str) -> str:
    if not sys.stdin.isatty():
        raise CliError(f"{why}: no terminal to ask on (use --passphrase-env / --password-env)")
    return getpass.getpass(prompt)


def _encrypted(text: str) -> bool:
    try:
        asyncssh.import_private_key(text)
    except (asyncssh.KeyImportError, asyncssh.KeyEncryptionError) as exc:
        return "passphrase" in str(exc).lower() or "encrypt" in str(exc).lower()
    return False


def _is_loopback(address: str) -> bool:
    host = split_address(address)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _entries(args: argparse.Namespace) -> list[Entry]:
    defaults = Entry(
        env=args.environment,
        role=args.role,
        region=args.region,
        identity=args.identity,
        known_hosts=args.known_hosts,
        host_key=args.host_key,
        accept_new_host_key=args.accept_new_host_key or None,
        jump=args.jump,
    )
    notes: list[str] = []
    try:
        if args.inventory:
            entries = inventory.load(Path(args.inventory), defaults, notes)
        else:
            raw = _as_raw(Entry(ssh=args.ssh or "", ssm=args.ssm or "", name=args.node_name))
            entries = inventory.parse({"nodes": [raw]}, "the command line", defaults)
    except BootstrapError as exc:
        raise CliError(str(exc)) from None
    for note in notes:
        print(f"tetherctl: note: {note}", file=sys.stderr)
    missing = [e.target for e in entries if not e.env]
    if missing:
        raise CliError("--env is required (or env: in the inventory)")
    refused = []
    for e in entries:
        if e.ssh:
            try:
                _host_key_mode(e, args)
            except BootstrapError as exc:
                refused.append(f"{e.target}: {exc}")
    if refused:
        raise CliError("host key verification:\n  " + "\n  ".join(dict.fromkeys(refused)))
    return entries


def _host_key_mode(entry: Entry, args: argparse.Namespace) -> str:
    """strict, accept-new or off for this machine (``hostkeys.decide_mode``)."""
    return decide_mode(
        entry.host_key_policy,
        accept_new=entry.accept_new_host_key,
        insecure=bool(getattr(args, "insecure_ignore_host_key", False)),
        pinned=bool(entry.host_key),
    )


def _host_port(value: str) -> tuple[str, int]:
    """``HOST`` or ``HOST:PORT`` (port 0: any free one)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or (host.count(":") and not host.startswith("[")):
        return value.strip("[]"), 0
    return host.strip("[]"), int(port)


def _as_raw(entry: Entry) -> dict[str, Any]:
    return {k: v for k, v in entry.__dict__.items() if v not in ("", None)}


def _ssh_target(entry: Entry, args: argparse.Namespace, secrets: _Secrets) -> ssh.SshTarget:
    endpoint = ssh.SshEndpoint.parse(entry.ssh, entry.user or "root")
    key, passphrase = (Secret(""), Secret(""))
    if entry.identity:
        key, passphrase = secrets.key(entry.identity, args.passphrase_env)
    agent = ""
    if args.ssh_agent or entry.use_agent:
        # agentSocket only with useAgent (the inventory's note says it is ignored without it)
        agent = (entry.agent_socket if entry.use_agent else "") or os.environ.get("SSH_AUTH_SOCK", "")
        if not agent:
            raise CliError(f"{endpoint}: the ssh-agent is asked for, but SSH_AUTH_SOCK is not set")
    if not (key or secrets.password or agent):
        agent = os.environ.get("SSH_AUTH_SOCK", "")
        if not agent:
            raise CliError(
                f"{endpoint}: no way to log in: give --identity, --password-env/--ask-password or --ssh-agent"
            )
    try:
        mode = _host_key_mode(entry, args)
    except BootstrapError as exc:
        raise CliError(f"{endpoint}: {exc}") from None
    policy = policy_for(
        mode, known_hosts=(Path(entry.known_hosts),) if entry.known_hosts else (), pinned=entry.host_key
    )
    jump = ssh.SshEndpoint.parse(entry.jump, entry.user or "root") if entry.jump else None
    jump_credentials = None
    if jump is not None and entry.jump_identity:  # its own key only (holodeck: never the agent)
        jump_credentials = ssh.SshCredentials(*secrets.key(entry.jump_identity, args.passphrase_env))
    timed = entry.connect_timeout is not None or entry.handshake_timeout is not None
    return ssh.SshTarget(
        endpoint,
        ssh.SshCredentials(key, passphrase, secrets.password, agent),
        policy,
        jump,
        connect_timeout=entry.connect_timeout or ssh.CONNECT_TIMEOUT,
        jump_credentials=jump_credentials,
        handshake_timeout=(entry.handshake_timeout or ssh.HANDSHAKE_TIMEOUT) if timed else None,
        keepalive_interval=entry.keepalive_interval or ssh.KEEPALIVE_SECONDS,
        attempts=entry.max_retries or 1,
    )


VIA_CONTROLLER_UNSUPPORTED = (
    ("jump_identity", "a bastion key of its own (bastion.privateKey)"),
    ("use_agent", "the ssh-agent (useAgent)"),
    ("connect_timeout", "connectTimeout"),
    ("handshake_timeout", "handshakeTimeout"),
    ("keepalive_interval", "keepaliveInterval"),
    ("max_retries", "maxRetries"),
)


def _machine(entry: Entry, args: argparse.Namespace, secrets: _Secrets, controller: str) -> Machine:
    request = Request(
        environment=entry.env,
        role=entry.role or "worker",
        controller=controller,
        node_name=entry.name,
        force=args.force,
        verify_timeout=args.verify_timeout,
    )
    if entry.ssm:
        target = ssm.SsmTarget(entry.ssm, entry.region, args.ssm_endpoint, args.aws_profile)

        async def open_ssm() -> Transport:
            return await ssm.connect(target)

        return Machine(str(target), open_ssm, request)
    ssh_target = _ssh_target(entry, args, secrets)

    async def open_ssh() -> Transport:
        return await ssh.connect(ssh_target)

    return Machine(str(ssh_target), open_ssh, request)


def _delivery(args: argparse.Namespace, entries: list[Entry]) -> Delivery:
    if args.bundle_s3:
        import boto3

        region = next((e.region for e in entries if e.region), None)
        client = boto3.client("s3", region_name=region, endpoint_url=args.s3_endpoint or None)
        try:
            return S3Presigned(args.bundle_s3, client)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    return Push()


def _request_pb(entry: Entry, args: argparse.Namespace, secrets: _Secrets, controller: str) -> Any:
    request = wire.admin.BootstrapRequest(
        environment=entry.env,
        role=entry.role or "worker",
        node_name=entry.name,
        force=args.force,
        controller=controller,
        verify_timeout_seconds=int(args.verify_timeout),
    )
    if entry.ssm:
        request.ssm.CopyFrom(
            wire.admin.SsmTarget(
                instance_id=entry.ssm,
                region=entry.region,
                endpoint_url=args.ssm_endpoint,
                bundle_s3_uri=args.bundle_s3,
                s3_endpoint_url=args.s3_endpoint,
            )
        )
        return request
    unsupported = [what for name, what in VIA_CONTROLLER_UNSUPPORTED if getattr(entry, name)]
    if _host_key_mode(entry, args) == "off":
        unsupported.append("host key verification off")
    if unsupported:
        raise CliError(
            f"{entry.target}: --via-controller cannot carry {', '.join(unsupported)}: "
            "run the bootstrap from here (without --via-controller)"
        )
    t = _ssh_target(entry, args, secrets)
    known = Path(entry.known_hosts).expanduser().read_text() if entry.known_hosts else ""
    request.ssh.CopyFrom(
        wire.admin.SshTarget(
            host=t.endpoint.host,
            port=t.endpoint.port,
            user=t.endpoint.user,
            private_key=t.credentials.private_key.reveal().encode(),
            passphrase=t.credentials.passphrase.reveal(),
            password=t.credentials.password.reveal(),
            known_hosts=known,
            host_key=entry.host_key,
            accept_new_host_key=_host_key_mode(entry, args) == "accept-new",
            jump_host=str(t.jump) if t.jump else "",
        )
    )
    return request


def _warn_unverified(entries: list[Entry], args: argparse.Namespace) -> None:
    """One warning naming every machine whose host key is not verified (``off``)."""
    unverified = [e.target for e in entries if e.ssh and _host_key_mode(e, args) == "off"]
    if unverified:
        print(
            "tetherctl: WARNING: host keys are NOT verified for "
            + ", ".join(unverified)
            + " (--insecure-ignore-host-key): whoever answers at those addresses gets the SSH "
            "credentials and a join token",
            file=sys.stderr,
        )


async def _main(args: argparse.Namespace) -> int:
    conf = load_config(args)
    if args.host_key and (args.known_hosts or args.accept_new_host_key):
        raise CliError(
            "--host-key pins the one key to accept: it excludes --known-hosts and --accept-new-host-key"
        )
    if getattr(args, "insecure_ignore_host_key", False) and (args.host_key or args.accept_new_host_key):
        raise CliError(
            "--insecure-ignore-host-key checks no key at all: "
            "it excludes --host-key and --accept-new-host-key"
        )
    entries = _entries(args)
    _warn_unverified(entries, args)
    started = time.monotonic()
    await check_with_controller(conf, entries)  # unknown environments: refused before any SSH/SSM
    secrets = _Secrets()
    if args.password_env:
        secrets.password = secrets.add(Secret(_from_env(args.password_env, "password")))
    elif args.ask_password:
        secrets.password = secrets.add(Secret(_prompt("SSH password: ", "--ask-password")))
    controller = args.controller or ("" if args.via_controller else conf.controller)
    try:
        addresses = split_addresses(controller) if controller else ()  # several replicas: A,B
    except ValueError as exc:
        raise CliError(f"--controller: {exc}") from None
    for address in filter(_is_loopback, addresses):
        print(
            f"tetherctl: warning: nodes will dial the controller at {address}, a loopback address; "
            "pass --controller HOST:PORT that the machines can reach",
            file=sys.stderr,
        )
    out = sys.stdout if args.output == "text" else sys.stderr
    progress = Progress(out, [])
    channel = aio_channel(conf)
    try:
        stub = wire.AdminServiceStub(channel)
        if args.via_controller:
            results = await _via_controller(stub, entries, args, secrets, controller, progress)
        else:
            results = await _here(stub, conf, entries, args, secrets, controller, progress)
    finally:
        progress.close()
        await channel.close()
    if args.output == "json":
        json.dump([_result_json(r) for r in results], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        out.write("\n")
        summary(results, out)
    out.write(finished_line(results, time.monotonic() - started) + "\n")
    return 0 if all(r.outcome.ok for r in results) else 1


async def _here(
    stub: Any,
    conf: AdminConfig,
    entries: list[Entry],
    args: argparse.Namespace,
    secrets: _Secrets,
    controller: str,
    progress: Progress,
) -> list[Result]:
    machines = [_machine(e, args, secrets, controller) for e in entries]
    progress.expect([m.target for m in machines])
    wheels = PipWheels(find_links=Path(args.wheel_dir)) if args.wheel_dir else None
    bundles = BundleBuilder(Path(args.bundle_cache) if args.bundle_cache else None, wheels)
    delivery = _delivery(args, entries)
    server: BundleServer | None = None
    if args.serve_bundle and not args.bundle_s3:
        host, port = _host_port(args.serve_bundle)
        server = await BundleServer(host, port).start()
        delivery = Served(server, "downloaded from this machine")
    try:
        return await adopt_all(
            machines,
            registry=AdminRegistry(stub, conf.ca_hash),
            bundles=bundles,
            delivery=delivery,
            sink=progress,
            redactor=secrets.redactor,
            concurrency=args.concurrency,
        )
    finally:
        if server is not None:
            await server.close()


async def _via_controller(
    stub: Any,
    entries: list[Entry],
    args: argparse.Namespace,
    secrets: _Secrets,
    controller: str,
    progress: Progress,
) -> list[Result]:
    gate = asyncio.Semaphore(max(1, args.concurrency))
    requests = [(_request_pb(e, args, secrets, controller), e.target) for e in entries]

    async def one(request: Any, target: str) -> Result:
        async with gate:
            return await remote_adopt(stub, request, target, progress)

    return list(await asyncio.gather(*(one(r, t) for r, t in requests)))


def _result_json(r: Result) -> dict[str, Any]:
    facts = r.detected.facts if r.detected else None
    return {
        "node": r.node,
        "target": r.target,
        "outcome": r.outcome.value,
        "ok": r.outcome.ok,
        "message": r.message,
        "seconds": round(r.seconds, 2),
        "retryable": bool(r.error and r.error.retryable),
        "os": facts.os_pretty if facts else "",
        "arch": facts.arch if facts else "",
        "python": facts.python_version if facts else "",
        "nvidia_gpu": facts.nvidia_gpu if facts else False,
    }
