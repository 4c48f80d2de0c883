"""The AWS SSM transport: Run Command ``AWS-RunShellScript``, polled until it finishes.

Each ``run`` is one ``SendCommand`` followed by ``GetCommandInvocation`` polls with
exponential backoff and jitter (``PollPolicy``). Right after ``SendCommand`` the invocation may
not exist yet (``InvocationDoesNotExist``): that is retried for ``appear_seconds``. The exit code
is the invocation's ``ResponseCode``; stdout and stderr are what SSM returns (at most 24,000
characters each).

SSM keeps every command's parameters in the account's command history, so this transport is
``confidential_input = False``: file contents and stdin travel base64-encoded inside the command
text and must never be secret (``tether.bootstrap.sealing`` encrypts secrets to a key that only the node
holds). The agent bundle is too big for commands: the node downloads it (``tether.bootstrap.delivery``).
"""

from __future__ import annotations

import asyncio
import base64
import random
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tether.bootstrap.errors import BootstrapError, CommandFailed, CommandTimeout, ConnectError
from tether.bootstrap.transport import DEFAULT_TIMEOUT, CommandResult, Transport

DOCUMENT = "AWS-RunShellScript"
TERMINAL = {"Success", "Failed", "TimedOut", "Cancelled", "Cancelling"}
CHUNK = 24 * 1024  # raw bytes per command when writing a file (base64 grows it by 4/3)
MAX_FILE = 1024 * 1024  # files bigger than this are fetched by the node instead


@dataclass(frozen=True)
class SsmTarget:
    instance_id: str
    region: str
    endpoint_url: str = ""  # VPC endpoints and tests
    profile: str = ""

    def __str__(self) -> str:
        return f"ssm:{self.instance_id} ({self.region})"


@dataclass(frozen=True)
class PollPolicy:
    initial: float = 0.5
    factor: float = 1.6
    cap: float = 5.0
    jitter: float = 0.2  # +/- this fraction
    appear_seconds: float = 30.0  # how long an invocation may take to show up

    def delays(self) -> Any:
        delay = self.initial
        while True:
            yield delay * (1 + random.uniform(-self.jitter, self.jitter))
            delay = min(self.cap, delay * self.factor)


def make_client(target: SsmTarget) -> Any:
    """A boto3 SSM client for the target's region (credentials from the usual AWS chain)."""
    import boto3
    from botocore.config import Config

    session = boto3.session.Session(profile_name=target.profile or None)
    return session.client(
        "ssm",
        region_name=target.region,
        endpoint_url=target.endpoint_url or None,
        config=Config(retries={"max_attempts": 4, "mode": "standard"}, connect_timeout=10, read_timeout=30),
    )


async def connect(target: SsmTarget, client: Any = None, *, poll: PollPolicy | None = None) -> SsmTransport:
    """A transport to the instance, after one round trip that proves commands run there as root."""
    transport = SsmTransport(target, client if client is not None else make_client(target), poll=poll)
    result = await transport.run("id -u", timeout=60)
    if not result.ok or result.stdout.strip() != "0":
        raise ConnectError(f"commands on {target} do not run as root (id -u: {result.stdout.strip()!r})")
    return transport


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


class SsmTransport(Transport):
    kind = "ssm"
    confidential_input = False

    def __init__(
        self,
        target: SsmTarget,
        client: Any,
        *,
        poll: PollPolicy | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(str(target))
        self.instance_id = target.instance_id
        self._client = client
        self._poll = poll or PollPolicy()
        self._sleep = sleep
        self._clock = clock
        self.polls = 0  # GetCommandInvocation calls made (for tests and timings)

    async def _call(self, method: str, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(getattr(self._client, method), **kwargs)
        except Exception as exc:
            code = _error_code(exc)
            if code == "InvocationDoesNotExist":
                raise
            if code in ("InvalidInstanceId", "UnsupportedPlatformType"):
                raise ConnectError(
                    f"SSM cannot run commands on {self.instance_id} ({code}): is its SSM agent online?",
                    target=self.target,
                ) from None
            if code:
                raise ConnectError(f"SSM {method} failed: {code}", target=self.target) from None
            raise ConnectError(
                f"SSM {method} failed: {type(exc).__name__}: {exc}", target=self.target
            ) from None

    async def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> CommandResult:
        script = f"/bin/sh -c {shlex.quote(command)}"
        if stdin:
            if len(stdin) > MAX_FILE:
                raise BootstrapError(f"{len(stdin)} bytes of input are too many for an SSM command")
            encoded = base64.b64encode(stdin).decode()
            script = f"printf %s {encoded} | base64 -d | {script}"
        execution = max(30, int(timeout))
        sent = await self._call(
            "send_command",
            InstanceIds=[self.instance_id],
            DocumentName=DOCUMENT,
            Parameters={"commands": [script], "executionTimeout": [str(execution)]},
            TimeoutSeconds=max(30, min(2_592_000, execution)),
            Comment="tether bootstrap",
        )
        command_id = sent["Command"]["CommandId"]
        return await self._wait(command_id, timeout)

    async def _wait(self, command_id: str, timeout: float) -> CommandResult:
        start = self._clock()
        deadline = start + timeout + 30  # SSM's own executionTimeout fires first
        for delay in self._poll.delays():
            await self._sleep(delay)
            self.polls += 1
            try:
                inv = await self._call(
                    "get_command_invocation", CommandId=command_id, InstanceId=self.instance_id
                )
            except Exception as exc:
                if _error_code(exc) != "InvocationDoesNotExist":
                    raise
                if self._clock() - start > self._poll.appear_seconds:
                    raise ConnectError(
                        f"SSM never delivered the command to {self.instance_id}", target=self.target
                    ) from None
                continue
            status = str(inv.get("Status", ""))
            if status in TERMINAL:
                return self._result(inv, status, timeout)
            detail = str(inv.get("StatusDetails", ""))
            if detail in ("DeliveryTimedOut", "Undeliverable", "Terminated"):
                raise ConnectError(
                    f"SSM could not deliver the command to {self.instance_id} ({detail})",
                    target=self.target,
                )
            if self._clock() > deadline:
                raise CommandTimeout(f"an SSM command on {self.instance_id} ran past {timeout:.0f}s")
        raise AssertionError("unreachable")  # pragma: no cover

    def _result(self, inv: dict[str, Any], status: str, timeout: float) -> CommandResult:
        if status == "TimedOut":
            raise CommandTimeout(
                f"an SSM command on {self.instance_id} ran past {timeout:.0f}s", target=self.target
            )
        stdout = str(inv.get("StandardOutputContent", ""))
        stderr = str(inv.get("StandardErrorContent", ""))
        if status in ("Cancelled", "Cancelling"):
            raise CommandFailed("an SSM command (cancelled)", -1, stderr, target=self.target)
        code = int(inv.get("ResponseCode", -1))
        if status == "Failed" and code == 0:
            code = 1
        return CommandResult(code, stdout, stderr)

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        if len(data) > MAX_FILE:
            raise BootstrapError(f"{path}: {len(data)} bytes are too many to send as SSM commands")
        q = shlex.quote(path)
        tmp = shlex.quote(f"{path}.tether-part")
        directory_umask = "077" if mode & 0o077 == 0 else "022"
        chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]
        finish = f"chmod {mode:o} {tmp}; chown 0:0 {tmp}; mv -f {tmp} {q}"
        for index, chunk in enumerate(chunks):
            redirect = ">" if index == 0 else ">>"
            encoded = base64.b64encode(chunk).decode()
            prefix = (
                f'(umask {directory_umask}; mkdir -p "$(dirname {q})"); umask 077; '
                if index == 0
                else "umask 077; "
            )
            last = f"; {finish}" if index == len(chunks) - 1 else ""  # one command for a small file
            await self.check(
                f"writing {path}", f"set -e; {prefix}printf %s '{encoded}' | base64 -d {redirect} {tmp}{last}"
            )

    async def close(self) -> None:
        return None
