"""The SSM transport through real boto3 over HTTP, against the test endpoint (tests/fakes/ssm_endpoint.py),
which really runs the commands here with /bin/sh. The adoption tests need root (the transport
checks that commands run as root, as they do under the SSM agent); the transport tests do not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from tests.fakes.ssm_endpoint import SsmEndpoint, local_shell
from tests.integration.conftest import apply_env
from tests.integration.harness import BIN, Controller
from tether.bootstrap import ssm
from tether.bootstrap.sealing import write_secret
from tether.nodeagent.secrets import Secret

pytestmark = pytest.mark.integration
INSTANCE = "i-0123456789abcdef0"
FAST = ssm.PollPolicy(initial=0.02, factor=1.5, cap=0.2)
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="SSM runs commands as root; the transport checks it"
)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for key, value in {**fake, "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def endpoint(aws_env: None) -> Iterator[SsmEndpoint]:
    ep = SsmEndpoint(local_shell(), [INSTANCE], invisible_polls=2)
    ep.start()
    yield ep
    ep.stop()


def client(ep: SsmEndpoint) -> Any:
    return boto3.client(
        "ssm", region_name="us-east-1", endpoint_url=ep.url, config=Config(retries={"max_attempts": 1})
    )


def transport(ep: SsmEndpoint) -> ssm.SsmTransport:
    return ssm.SsmTransport(ssm.SsmTarget(INSTANCE, "us-east-1", ep.url), client(ep), poll=FAST)


async def test_commands_run_for_real_with_output_exit_code_and_stdin(
    endpoint: SsmEndpoint, tmp_path: Path
) -> None:
    t = transport(endpoint)
    result = await t.run(f"echo out; echo err >&2; touch {tmp_path}/ran; exit 4")
    assert (result.exit_code, result.stdout, result.stderr) == (4, "out\n", "err\n")
    assert (tmp_path / "ran").exists()  # moto would only have recorded it
    assert (await t.run("tr a-z A-Z", stdin=b"quiet")).stdout == "QUIET"
    assert t.polls >= 3 * 2  # every invocation was invisible for its first two polls, and still found
    invocations = client(endpoint).list_command_invocations(InstanceId=INSTANCE, Details=True)[
        "CommandInvocations"
    ]
    assert {i["Status"] for i in invocations} == {"Success", "Failed"}
    assert any(p["ResponseCode"] == 4 for i in invocations for p in i["CommandPlugins"])


async def test_files_arrive_complete_with_their_mode(endpoint: SsmEndpoint, tmp_path: Path) -> None:
    data = os.urandom(70_000)
    await transport(endpoint).write_file(str(tmp_path / "d/e/blob"), data, mode=0o640)
    assert (tmp_path / "d/e/blob").read_bytes() == data
    assert oct((tmp_path / "d/e/blob").stat().st_mode & 0o777) == "0o640"


async def test_a_secret_is_sealed_and_never_in_the_command_history(
    endpoint: SsmEndpoint, tmp_path: Path
) -> None:
    secret = "tok123.sealedcanarysealedcanary00000"
    dest = tmp_path / "etc/tether/join-token"
    lib = sysconfig.get_paths()["purelib"]
    await write_secret(transport(endpoint), str(dest), Secret(secret), python=sys.executable, lib_dir=lib)
    assert dest.read_text() == secret
    assert oct(dest.stat().st_mode & 0o777) == "0o600"
    history = json.dumps(endpoint.sent)
    assert len(endpoint.sent) == 2
    assert secret not in history and secret.split(".")[1] not in history


async def test_unknown_instances_are_refused(endpoint: SsmEndpoint) -> None:
    t = ssm.SsmTransport(ssm.SsmTarget("i-nope", "us-east-1", endpoint.url), client(endpoint), poll=FAST)
    with pytest.raises(ssm.ConnectError, match="InvalidInstanceId"):
        await t.run("true")


@pytest.fixture
def controller(tmp_path: Path, aws_env: None) -> Iterator[Controller]:
    c = Controller(tmp_path)
    c.start()
    apply_env(c, tmp_path, "lab", "    - name: hello\n      inline: echo hi\n")
    yield c
    c.kill()


def cli(controller: Controller, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TETHER_CONFIG": str(controller.config)}
    argv = [str(BIN / "tetherctl"), "bootstrap", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)


@needs_root
@pytest.mark.parametrize("via_controller", [False, True])
def test_cli_over_ssm_detects_then_refuses_this_host(
    endpoint: SsmEndpoint, controller: Controller, via_controller: bool
) -> None:
    args = [
        "--env",
        "lab",
        "--ssm",
        INSTANCE,
        "--region",
        "us-east-1",
        "--ssm-endpoint",
        endpoint.url,
        "--serve-bundle",
        "127.0.0.1",
    ] + (["--via-controller"] if via_controller else [])
    out = cli(controller, *args)
    assert out.returncode == 1, out.stderr
    assert f"ssm:{INSTANCE}" in out.stdout
    assert "connect succeeded" in out.stdout
    assert "detect  info" in out.stdout
    assert "refused: unsupported host: systemd is not running as PID 1" in out.stdout
    assert endpoint.calls["SendCommand"] >= 2  # id -u, then detection: both really ran here
    tokens = json.loads(controller.ctl("token", "list", "--env", "lab", "-o", "json").stdout)
    assert tokens == []  # refused before anything: not even a join token


@needs_root
def test_cli_reports_an_unmanaged_instance_as_failed(endpoint: SsmEndpoint, controller: Controller) -> None:
    out = cli(
        controller,
        "--env",
        "lab",
        "--ssm",
        "i-0ffffffffffffffff",
        "--region",
        "us-east-1",
        "--ssm-endpoint",
        endpoint.url,
        "-o",
        "json",
    )
    assert out.returncode == 1
    [result] = json.loads(out.stdout)
    assert result["outcome"] == "failed"
    assert "InvalidInstanceId" in result["message"]
