"""The SSM transport against a fake boto3 client: polling with backoff, statuses, exit codes."""

from __future__ import annotations

import base64
import re
import shlex
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tether.bootstrap.errors import CommandTimeout, ConnectError
from tether.bootstrap.ssm import DOCUMENT, PollPolicy, SsmTarget, SsmTransport

TARGET = SsmTarget("i-0123456789abcdef0", "us-east-1")


def client_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, "GetCommandInvocation")


class FakeSsm:
    """Scripted answers: each GetCommandInvocation pops the next one (an exception or a dict)."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.sent: list[dict[str, Any]] = []
        self.polled = 0

    def send_command(self, **kw: Any) -> dict[str, Any]:
        self.sent.append(kw)
        return {"Command": {"CommandId": f"cmd-{len(self.sent)}"}}

    def get_command_invocation(self, **kw: Any) -> dict[str, Any]:
        assert kw == {"CommandId": f"cmd-{len(self.sent)}", "InstanceId": TARGET.instance_id}
        self.polled += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)


def done(status: str = "Success", code: int = 0, out: str = "", err: str = "") -> dict[str, Any]:
    return {
        "Status": status,
        "StatusDetails": status,
        "ResponseCode": code,
        "StandardOutputContent": out,
        "StandardErrorContent": err,
    }


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def transport(fake: FakeSsm, clock: Clock, **policy: Any) -> SsmTransport:
    return SsmTransport(TARGET, fake, poll=PollPolicy(jitter=0, **policy), sleep=clock.sleep, clock=clock)


async def test_polls_with_growing_capped_delays_until_done() -> None:
    fake, clock = FakeSsm([done("Pending", -1)] + [done("InProgress", -1)] * 7 + [done(out="hi\n")]), Clock()
    result = await transport(fake, clock, initial=0.5, factor=2.0, cap=3.0).run("echo hi", timeout=60)
    assert (result.exit_code, result.stdout) == (0, "hi\n")
    assert clock.sleeps == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0]
    sent = fake.sent[0]
    assert sent["DocumentName"] == DOCUMENT
    assert sent["InstanceIds"] == [TARGET.instance_id]
    assert sent["Parameters"]["commands"] == ["/bin/sh -c 'echo hi'"]
    assert sent["Parameters"]["executionTimeout"] == ["60"]


async def test_jitter_stays_within_its_band() -> None:
    delays = PollPolicy(initial=1.0, factor=1.0, cap=1.0, jitter=0.2).delays()
    values = [next(delays) for _ in range(200)]
    assert all(0.8 <= v <= 1.2 for v in values)
    assert len({round(v, 6) for v in values}) > 50


async def test_failed_commands_keep_their_exit_code_and_output() -> None:
    fake, clock = FakeSsm([done("Failed", 7, "partial\n", "boom\n")]), Clock()
    result = await transport(fake, clock).run("exit 7")
    assert (result.exit_code, result.stdout, result.stderr) == (7, "partial\n", "boom\n")


async def test_an_invocation_that_is_not_visible_yet_is_polled_again() -> None:
    fake = FakeSsm([client_error("InvocationDoesNotExist")] * 3 + [done(out="ok")])
    clock = Clock()
    result = await transport(fake, clock).run("true")
    assert result.stdout == "ok"
    assert fake.polled == 4


async def test_an_invocation_that_never_appears_is_a_connect_error() -> None:
    fake, clock = FakeSsm([client_error("InvocationDoesNotExist")] * 100), Clock()
    with pytest.raises(ConnectError, match="never delivered"):
        await transport(fake, clock, cap=1.0, appear_seconds=5.0).run("true")
    assert clock.now <= 7.0


async def test_timed_out_and_undeliverable_commands() -> None:
    clock = Clock()
    with pytest.raises(CommandTimeout):
        await transport(FakeSsm([done("TimedOut", -1)]), clock).run("sleep 999", timeout=30)
    undeliverable = {"Status": "InProgress", "StatusDetails": "Undeliverable", "ResponseCode": -1}
    with pytest.raises(ConnectError, match="Undeliverable"):
        await transport(FakeSsm([undeliverable]), clock).run("true")
    with pytest.raises(CommandTimeout):  # SSM never says it is done: our own deadline
        await transport(FakeSsm([done("InProgress", -1)] * 1000), clock, cap=5.0).run("true", timeout=30)


async def test_other_api_errors_name_the_problem() -> None:
    class Refusing(FakeSsm):
        def send_command(self, **kw: Any) -> dict[str, Any]:
            raise ClientError({"Error": {"Code": "InvalidInstanceId", "Message": "x"}}, "SendCommand")

    with pytest.raises(ConnectError, match=r"InvalidInstanceId.*SSM agent online"):
        await transport(Refusing([]), Clock()).run("true")


async def test_stdin_and_files_travel_base64_encoded_in_chunks() -> None:
    fake = FakeSsm([done()] * 10)
    t = transport(fake, Clock())
    await t.run("cat", stdin=b"in'put")
    assert base64.b64encode(b"in'put").decode() in fake.sent[0]["Parameters"]["commands"][0]
    data = bytes(range(256)) * 200  # 51,200 bytes: three chunks, the last one also renames
    await t.write_file("/etc/x y", data, mode=0o640)
    scripts = [shlex.split(s["Parameters"]["commands"][0])[2] for s in fake.sent[1:]]  # inside /bin/sh -c
    assert len(scripts) == 3
    joined = "".join(scripts)
    pieces = [base64.b64decode(p) for p in re.findall(r"printf %s '([A-Za-z0-9+/=]+)'", joined)]
    assert b"".join(pieces) == data
    assert "chmod 640" in scripts[-1] and "'/etc/x y'" in scripts[-1]
    assert not t.confidential_input
