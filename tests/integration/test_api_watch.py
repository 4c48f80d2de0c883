"""WatchNodes through the real API (the generated stub, an admin.conf's certificate): a real agent
seen going provisioning -> provisioned, a watch resumed after a disconnect without a change missed
or repeated, revoke and delete, the SDK across a controller restart, and ``node list -w``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.integration.conftest import apply_env, ca_hash, token, wait_state
from tests.integration.harness import BIN, Agent, Controller
from tether.controller import wire
from tether.controller.adminconf import AdminConfig
from tether.controller.client.watch import RELIST, watch_nodes
from tether.nodeagent.identity import CONTROLLER_SERVER_NAME

ADDED, MODIFIED = wire.admin.NODE_EVENT_TYPE_ADDED, wire.admin.NODE_EVENT_TYPE_MODIFIED
DELETED, SYNCED = wire.admin.NODE_EVENT_TYPE_DELETED, wire.admin.NODE_EVENT_TYPE_SYNCED
CALL_DEADLINE = 120  # a stream that never sends what a test waits for fails it, not hangs it
NOOP = '    - name: noop\n      inline: "true"\n'


def admin_stub(controller: Controller) -> tuple[Any, grpc.Channel]:
    conf = AdminConfig.read(controller.config)
    creds = grpc.ssl_channel_credentials(conf.ca_pem, conf.key_pem, conf.cert_pem)
    options = [("grpc.ssl_target_name_override", CONTROLLER_SERVER_NAME)]
    channel = grpc.secure_channel(controller.address, creds, options=options)
    return wire.AdminServiceStub(channel), channel


@pytest.fixture
def stub(controller: Controller) -> Iterator[Any]:
    s, channel = admin_stub(controller)
    yield s
    channel.close()


def watch(stub: Any, revision: int = 0, environment: str = "") -> Any:
    request = wire.admin.WatchNodesRequest(environment=environment, revision=revision)
    return stub.WatchNodes(request, timeout=CALL_DEADLINE)


def until(call: Any, done: Callable[[Any], bool]) -> list[Any]:
    """Events of ``call`` up to and including the first that is ``done``."""
    seen = []
    for event in call:
        seen.append(event)
        if done(event):
            return seen
    raise AssertionError(f"the watch ended before the event waited for: {seen}")


def changes(events: list[Any]) -> list[tuple[int, str, str]]:
    return [(e.type, e.node.name, e.reason) for e in events]


def test_a_watch_sees_a_real_node_enroll_provision_go_offline_come_back_and_go(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path, stub: Any
) -> None:
    apply_env(controller, tmp_path, "w", NOOP)
    call = watch(stub)
    synced = until(call, lambda e: e.type == SYNCED)
    assert changes(synced) == [(SYNCED, "", "")]  # no node yet: the list is empty
    agent = agents("n1")
    agent.start(token(controller, "w"), ca_hash(controller))
    seen = until(call, lambda e: e.reason == "provisioned")
    assert changes(seen) == [
        (ADDED, "n1", "enrolled"),
        (MODIFIED, "n1", "provisioning"),
        (MODIFIED, "n1", "provisioned"),
    ]
    revisions = [synced[-1].revision] + [e.revision for e in seen]
    assert revisions == sorted(set(revisions))  # increasing, one per change
    assert seen[-1].node.state == "provisioned" and seen[-1].node.environment == "w"
    call.cancel()

    last = seen[-1].revision
    agent.kill()  # while nobody watches: the node goes offline
    wait_state(controller, ["n1"], "offline")
    agent.start()  # and comes back (enrolled, it needs only its state dir)
    wait_state(controller, ["n1"], "provisioned")
    resumed = watch(stub, last)
    missed = until(resumed, lambda e: e.reason == "provisioned")
    assert changes(missed) == [(MODIFIED, "n1", "offline"), (MODIFIED, "n1", "provisioned")]
    assert missed[0].revision == last + 1 and missed[1].revision == last + 2  # none missed, none twice

    stub.RevokeNode(wire.admin.RevokeNodeRequest(name="n1"), timeout=30)
    stub.DeleteNode(wire.admin.DeleteNodeRequest(name="n1"), timeout=30)
    gone = until(resumed, lambda e: e.type == DELETED)
    assert changes(gone) == [(MODIFIED, "n1", "revoked"), (DELETED, "n1", "deleted")]
    assert gone[1].node.name == "n1" and gone[1].node.environment == "w"  # its last record
    resumed.cancel()


def test_a_watch_of_one_environment_lists_its_nodes_only(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path, stub: Any
) -> None:
    apply_env(controller, tmp_path, "a", NOOP)
    apply_env(controller, tmp_path, "b", NOOP)
    agents("in-a").start(token(controller, "a"), ca_hash(controller))
    agents("in-b").start(token(controller, "b"), ca_hash(controller))
    wait_state(controller, ["in-a", "in-b"], "provisioned")
    call = watch(stub, environment="a")
    listed = until(call, lambda e: e.type == SYNCED)
    call.cancel()
    assert changes(listed) == [(ADDED, "in-a", ""), (SYNCED, "", "")]
    assert listed[0].node.state == "provisioned" and listed[0].revision == listed[1].revision


def test_a_revision_not_kept_is_out_of_range(controller: Controller, stub: Any) -> None:
    call = watch(stub)
    current = until(call, lambda e: e.type == SYNCED)[-1].revision
    call.cancel()
    with pytest.raises(grpc.RpcError) as exc:
        list(watch(stub, 1))  # a revision of no run of this controller
    assert exc.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "revision 1 is no longer kept" in exc.value.details() and "list again" in exc.value.details()
    assert current > 1


def test_the_sdk_watch_lists_again_after_a_controller_restart(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path, stub: Any
) -> None:
    apply_env(controller, tmp_path, "r", NOOP)
    agents("n1").start(token(controller, "r"), ca_hash(controller))
    wait_state(controller, ["n1"], "provisioned")
    events = watch_nodes(stub, "r")
    first = [next(events), next(events)]
    assert changes(first) == [(ADDED, "n1", ""), (SYNCED, "", "")]
    controller.kill()  # the stream breaks; the revisions of this run are gone with it
    controller.start(port=controller.port)
    marker = next(events)  # it reconnected from its revision, was told OUT_OF_RANGE, lists again
    assert (marker.type, marker.reason) == (wire.admin.NODE_EVENT_TYPE_UNSPECIFIED, RELIST)
    relisted = [next(events), next(events)]
    assert changes(relisted) == [(ADDED, "n1", ""), (SYNCED, "", "")]
    assert relisted[1].revision > first[1].revision  # revisions grow across restarts
    events.close()


def test_node_list_watch_prints_json_lines_and_exits_130_on_ctrl_c(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path, stub: Any
) -> None:
    apply_env(controller, tmp_path, "c", NOOP)
    agents("n1").start(token(controller, "c"), ca_hash(controller))
    wait_state(controller, ["n1"], "provisioned")
    env = {**os.environ, "TETHER_CONFIG": str(controller.config)}
    with subprocess.Popen(
        [str(BIN / "tetherctl"), "node", "list", "-w", "-o", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        try:
            _watch_lines(proc, stub)
        finally:
            if proc.poll() is None:
                proc.kill()


def _watch_lines(proc: subprocess.Popen[str], stub: Any) -> None:
    """The list's lines, a change's line, then Ctrl-C."""
    assert proc.stdout is not None
    listed = [json.loads(proc.stdout.readline()) for _ in range(2)]
    assert [(x["type"], x["node"] and x["node"]["name"]) for x in listed] == [
        ("added", "n1"),
        ("synced", None),
    ]
    stub.RevokeNode(wire.admin.RevokeNodeRequest(name="n1"), timeout=30)
    change = json.loads(proc.stdout.readline())
    assert (change["type"], change["reason"], change["node"]["name"]) == ("modified", "revoked", "n1")
    assert change["revision"] == listed[1]["revision"] + 1 and change["time"].endswith("Z")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    assert proc.stderr is not None and "Traceback" not in proc.stderr.read()


def test_the_sdk_example_reacts_to_a_failed_node(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path, stub: Any
) -> None:
    apply_env(controller, tmp_path, "f", '    - name: broken\n      inline: "exit 3"\n')
    example = Path(__file__).parents[2] / "docs" / "examples" / "watch_nodes.py"
    argv = [
        sys.executable,
        str(example),
        "--env",
        "f",
        "--max-failed",
        "0",
        "--config",
        str(controller.config),
    ]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("0 node(s), watching")  # listed (none yet), watching
        agents("n1").start(token(controller, "f"), ca_hash(controller))
        out, err = proc.communicate(timeout=CALL_DEADLINE)
    assert proc.returncode == 1, err
    assert out.splitlines()[-2:] == ["n1 (f): failed", "failed: 1 (n1)"]
    assert "more than 0 node(s) failed: stopping" in err
