"""Issue 10, item 1: what anyone holding the public anonymous identity can make the controller hold."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import yaml

from tests.integration.harness import Controller
from tether.nodeagent import anonymous, wire
from tether.nodeagent.identity import CONTROLLER_SERVER_NAME
from tether.nodeagent.limits import ANONYMOUS_MESSAGE_BYTES, MiB

pytestmark = pytest.mark.integration

PEAK_RSS_LIMIT = 400 * MiB


def _anonymous_channel(controller: Controller) -> grpc.Channel:
    ca = yaml.safe_load(controller.config.read_text())["ca"].encode()
    creds = grpc.ssl_channel_credentials(ca, anonymous.key_pem(), anonymous.CERT_PEM)
    return grpc.secure_channel(
        controller.address,
        creds,
        options=[
            ("grpc.ssl_target_name_override", CONTROLLER_SERVER_NAME),
            ("grpc.max_send_message_length", 64 * MiB),
        ],
    )


@pytest.fixture
def channel(controller: Controller) -> Iterator[grpc.Channel]:
    ch = _anonymous_channel(controller)
    yield ch
    ch.close()


def _enroll(channel: grpc.Channel, csr_bytes: int) -> grpc.StatusCode:
    stub = wire.AgentServiceStub(channel)
    request = wire.pb.EnrollRequest(token="tether-xxxxxx.yyyy", csr_pem=b"A" * csr_bytes, node_name="x")
    try:
        stub.Enroll(request, timeout=60)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


def test_eight_concurrent_48_mib_enrollments_are_refused_and_the_controller_stays_small(
    controller: Controller,
) -> None:
    assert controller.proc is not None
    channels = [_anonymous_channel(controller) for _ in range(8)]
    try:
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda ch: _enroll(ch, 48 * MiB), channels))
    finally:
        for ch in channels:
            ch.close()
    assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 8
    peak = _peak_rss(controller.proc.pid)
    print(f"controller peak RSS {peak / MiB:.0f} MiB")
    assert peak < PEAK_RSS_LIMIT, f"controller peak RSS {peak / MiB:.0f} MiB"
    # ... and it still answers.
    assert _enroll(_anonymous_channel(controller), 100) == grpc.StatusCode.PERMISSION_DENIED


def test_an_enrollment_over_the_anonymous_message_limit_is_refused(channel: grpc.Channel) -> None:
    stub = wire.AgentServiceStub(channel)
    request = wire.pb.EnrollRequest(token="tether-xxxxxx.yyyy", csr_pem=b"A" * (100 * 1024))
    with pytest.raises(grpc.RpcError) as exc:
        stub.Enroll(request, timeout=30)
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"over the limit of {ANONYMOUS_MESSAGE_BYTES} bytes" in (exc.value.details() or "")


def test_an_enrollment_under_the_limit_reaches_the_token_check(channel: grpc.Channel) -> None:
    assert _enroll(channel, ANONYMOUS_MESSAGE_BYTES // 2) == grpc.StatusCode.PERMISSION_DENIED
