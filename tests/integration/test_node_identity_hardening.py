"""Issue 10 on the wire: revocation races (2), restored store (5), token state on retry (11),
certificate rotation (12) and a corrupt database (15), against a real controller."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from tests.integration.conftest import apply_env, ca_hash, events, token, wait_state
from tests.integration.harness import BIN, Agent, Controller, wait_for
from tether.controller import wire
from tether.nodeagent import anonymous
from tether.nodeagent.identity import CONTROLLER_SERVER_NAME, make_csr
from tether.nodeagent.wire import AgentServiceStub

NOOP = '    - name: noop\n      inline: "echo hello"\n'


def node_channel(controller: Controller, agent: Agent, cert_pem: bytes | None = None) -> grpc.Channel:
    """A raw channel presenting the agent's key and certificate (or ``cert_pem``)."""
    state = agent.state_dir
    creds = grpc.ssl_channel_credentials(
        (state / "ca.pem").read_bytes(),
        (state / "key.pem").read_bytes(),
        cert_pem or (state / "cert.pem").read_bytes(),
    )
    return grpc.secure_channel(
        controller.address, creds, options=[("grpc.ssl_target_name_override", CONTROLLER_SERVER_NAME)]
    )


@contextlib.contextmanager
def raw_stream(channel: grpc.Channel) -> Iterator[tuple[queue.Queue[Any], Iterator[Any]]]:
    """An open Connect call: put AgentMessages on the queue (None ends it), read the replies."""
    outgoing: queue.Queue[Any] = queue.Queue()

    def requests() -> Iterator[Any]:
        while (msg := outgoing.get()) is not None:
            yield msg

    replies = AgentServiceStub(channel).Connect(requests(), timeout=30)
    try:
        yield outgoing, replies
    finally:
        outgoing.put(None)
        replies.cancel()


def hello() -> object:
    return wire.agent.AgentMessage(hello=wire.agent.Hello(agent_version="raw"))


def enrolled(controller: Controller, agents: Callable[[str], Agent], tmp_path: Path, env: str) -> Agent:
    apply_env(controller, tmp_path, env, NOOP)
    agent = agents("n1")
    agent.start(token(controller, env), ca_hash(controller))
    wait_state(controller, ["n1"], "provisioned")
    return agent


def test_a_stream_opened_before_revocation_gets_nothing_after_it(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    agent = enrolled(controller, agents, tmp_path, "rv")
    agent.kill()
    wait_state(controller, ["n1"], "offline")
    channel = node_channel(controller, agent)
    with raw_stream(channel) as (outgoing, replies):
        time.sleep(1.0)  # let the controller pass its opening checks and wait for hello
        controller.ctl("node", "revoke", "n1")
        outgoing.put(hello())
        received: list[str] = []

        def read_all() -> None:
            received.extend(msg.WhichOneof("kind") for msg in replies)

        with pytest.raises(grpc.RpcError) as exc:
            read_all()
    channel.close()
    assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert received == []  # no welcome, no plan


def same_key_enrollment(controller: Controller, agent: Agent, tok: str) -> tuple[grpc.Channel, Any]:
    """A channel with the public anonymous identity and the Enroll request an enrolled node's
    agent would send again after a lost reply (its own key, its token)."""
    ca = yaml.safe_load(controller.config.read_text())["ca"].encode()
    creds = grpc.ssl_channel_credentials(ca, anonymous.key_pem(), anonymous.CERT_PEM)
    channel = grpc.secure_channel(
        controller.address, creds, options=[("grpc.ssl_target_name_override", CONTROLLER_SERVER_NAME)]
    )
    csr = make_csr((agent.state_dir / "key.pem").read_bytes(), agent.name)
    return channel, wire.agent.EnrollRequest(token=tok, csr_pem=csr, node_name=agent.name)


def test_a_revoked_token_cannot_re_enroll_the_same_key(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    apply_env(controller, tmp_path, "rt", NOOP)
    tok = token(controller, "rt")
    agent = agents("n1")
    agent.start(tok, ca_hash(controller))
    wait_state(controller, ["n1"], "provisioned")
    agent.kill()
    controller.ctl("token", "revoke", tok.split(".")[0])
    channel, request = same_key_enrollment(controller, agent, tok)
    with pytest.raises(grpc.RpcError) as exc:
        AgentServiceStub(channel).Enroll(request, timeout=10)
    channel.close()
    assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "revoked" in (exc.value.details() or "")


def test_the_same_key_asking_again_and_again_is_rate_limited_like_renewals(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    """A lost reply is retried with the same key and token; that gives a new certificate, so it
    is charged to the node's renewal quota (or a node could reissue certificates at will)."""
    from tether.controller.limits import NODE_RENEWALS_PER_HOUR

    apply_env(controller, tmp_path, "rq", NOOP)
    tok = token(controller, "rq")
    agent = agents("n1")
    agent.start(tok, ca_hash(controller))
    wait_state(controller, ["n1"], "provisioned")
    agent.kill()
    channel, request = same_key_enrollment(controller, agent, tok)
    codes = []
    for _ in range(int(NODE_RENEWALS_PER_HOUR) + 2):
        try:
            AgentServiceStub(channel).Enroll(request, timeout=10)
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            codes.append(exc.code())
    channel.close()
    allowed = int(NODE_RENEWALS_PER_HOUR)
    assert codes == [grpc.StatusCode.OK] * allowed + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2


def status(agent: Agent) -> dict[str, object]:
    return json.loads(agent.status())  # type: ignore[no-any-return]


def test_a_store_restored_from_an_earlier_copy_lets_the_outbox_drain(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    agent = enrolled(controller, agents, tmp_path, "bk")
    backup = tmp_path / "backup.db"
    with (
        contextlib.closing(sqlite3.connect(controller.data_dir / "tether.db")) as src,
        contextlib.closing(sqlite3.connect(backup)) as dst,
    ):
        src.backup(dst)
    before = len(events(controller, "n1"))
    controller.ctl("node", "rerun", "n1")  # events the backup does not have, acknowledged
    wait_for(lambda: len(events(controller, "n1")) > before + 2, what="the rerun's events")
    wait_state(controller, ["n1"], "provisioned")
    wait_for(lambda: status(agent)["outbox_pending"] == 0, what="the outbox to drain")
    acked = int(status(agent)["acked_seq"])  # type: ignore[call-overload]
    controller.kill()
    db = controller.data_dir / "tether.db"
    for suffix in ("-wal", "-shm"):
        db.with_name(db.name + suffix).unlink(missing_ok=True)
    db.write_bytes(backup.read_bytes())
    controller.start()
    wait_state(controller, ["n1"], "provisioned")
    controller.ctl("node", "rerun", "n1")  # new events, numbered after the ones the store lacks
    wait_for(lambda: status(agent)["outbox_pending"] == 0, what="the outbox to drain after the restore")
    stored = events(controller, "n1")
    gap = [e for e in stored if "acknowledged before" in str(e.get("message", ""))]
    assert len(gap) == 1 and f"{before + 1}..{acked}" in str(gap[0]["message"])
    assert max(int(e["seq"]) for e in stored) > acked  # type: ignore[call-overload]


def test_a_renewed_certificate_retires_the_old_one(tmp_path: Path) -> None:
    # Node certificates of ~43 s: the agent renews with a third of the lifetime left (~28 s in).
    controller = Controller(tmp_path, extra_args=("--node-cert-days", "0.0005"))
    controller.start()
    agent = Agent(tmp_path, "n1", controller)
    try:
        apply_env(controller, tmp_path, "rn", NOOP)
        agent.start(token(controller, "rn"), ca_hash(controller))
        wait_state(controller, ["n1"], "provisioned")
        old_cert = (agent.state_dir / "cert.pem").read_bytes()
        wait_for(lambda: (agent.state_dir / "cert.pem").read_bytes() != old_cert, 60, what="a renewal")
        agent.kill()
        agent.start()  # reconnects with the renewed certificate
        wait_for(lambda: "the previous certificate is retired" in controller.log_path.read_text(), 60)
        channel = node_channel(controller, agent, cert_pem=old_cert)
        with raw_stream(channel) as (outgoing, replies):
            outgoing.put(hello())
            with pytest.raises(grpc.RpcError) as exc:
                next(replies)
        channel.close()
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        agent.kill()
        controller.kill()


def test_a_corrupt_database_is_one_line_naming_the_file(tmp_path: Path) -> None:
    data = tmp_path / "controller"
    data.mkdir()
    (data / "tether.db").write_bytes(os.urandom(4096))
    out = subprocess.run(
        [str(BIN / "tether-controller"), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert str(data / "tether.db") in lines[0] and "backup" in lines[0]
