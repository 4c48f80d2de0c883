"""``tetherctl wait`` on the SDK's one check (tether.controller.client.waiting): its lines and exit
codes, by environment and by node, against a fake controller."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from types import SimpleNamespace

import grpc
import pytest

from tether.controller.cli import waiting as cli
from tether.controller.client import waiting as sdk
from tether.controller.client.errors import NotFoundError
from tether.v1 import admin_pb2


class FakeController:
    """A ``Reader`` over a few nodes of environments at generation 2."""

    def __init__(self, *nodes: admin_pb2.Node, halted: str = "") -> None:
        self.nodes = {n.name: n for n in nodes}
        self.halted = halted

    def get_environment(self, name: str) -> admin_pb2.Environment:
        return admin_pb2.Environment(name=name, generation=2)

    def get_node(self, name: str) -> admin_pb2.Node:
        if name not in self.nodes:
            raise NotFoundError(f"node {name!r} not found", code=grpc.StatusCode.NOT_FOUND)
        node = admin_pb2.Node()
        node.CopyFrom(self.nodes[name])
        if node.state == "failed":
            node.steps.add(name="kernel", state="failed", exit_code=3)
        return node

    def iter_nodes(self, environment: str = "", page_size: int = 0) -> Iterator[admin_pb2.Node]:
        return iter([n for n in self.nodes.values() if n.environment == environment])

    def get_rollout(self, environment: str) -> admin_pb2.Rollout | None:
        if not self.halted:
            return None
        return admin_pb2.Rollout(environment=environment, generation=2, state="halted", reason=self.halted)


def node(name: str, state: str, generation: int = 2, environment: str = "lab") -> admin_pb2.Node:
    return admin_pb2.Node(name=name, environment=environment, state=state, plan_generation=generation)


def test_the_check_by_environment_and_by_node() -> None:
    fake = FakeController(node("a", "provisioned"), node("b", "provisioning"), node("c", "enrolled", 1))
    assert sdk.check(fake, "lab").waiting == (
        "1/3 provisioned; provisioning: b (provisioning); 1 not yet on the current generation"
    )
    assert sdk.check_nodes(fake, ["a"]).done
    assert sdk.check_nodes(fake, ["a", "x", "y"]).waiting == "waiting for x, y to enroll"
    failed = FakeController(node("a", "provisioned"), node("b", "failed"))
    assert sdk.check(failed, "lab").failure == "node b: step kernel failed (exit 3)"
    assert sdk.check_nodes(failed, ["b", "x"]).failure == "node b: step kernel failed (exit 3)"
    assert sdk.check_nodes(FakeController(node("r", "revoked")), ["r"]).failure == "node r is revoked"
    halted = FakeController(node("a", "provisioned"), halted="maxFailures reached")
    expected = "the rollout of lab (generation 2) halted: maxFailures reached"
    assert sdk.check(halted, "lab").failure == sdk.check_nodes(halted, ["a"]).failure == expected
    assert sdk.check(FakeController(), "lab", min_nodes=1).waiting == "0/1 node(s) enrolled"


def run_wait(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fake: FakeController, **how: object
) -> tuple[int, str, str]:
    session = SimpleNamespace(client=fake, conf=SimpleNamespace(controller="127.0.0.1:1"))
    monkeypatch.setattr(cli, "Session", lambda args: session)
    monkeypatch.setattr(cli, "POLL_SECONDS", 0.01)
    args = argparse.Namespace(condition="provisioned", environment="", node=[], wait_timeout="1s")
    for key, value in how.items():
        setattr(args, key, value)
    code = cli.wait(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_tetherctl_wait_prints_and_exits_as_before(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    done = FakeController(node("a", "provisioned"))
    assert run_wait(monkeypatch, capsys, done, environment="lab") == (0, "environment lab: provisioned\n", "")
    assert run_wait(monkeypatch, capsys, done, node=["a"]) == (0, "a: provisioned\n", "")
    failed = FakeController(node("b", "failed"))
    assert run_wait(monkeypatch, capsys, failed, environment="lab") == (
        1,
        "",
        "tetherctl: node b: step kernel failed (exit 3)\n",
    )
    code, out, err = run_wait(monkeypatch, capsys, FakeController(), environment="lab")
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "waiting: no node of environment lab has enrolled yet",
        "tetherctl: timed out after 1s: no node of environment lab has enrolled yet",
    ]
    code, _, err = run_wait(monkeypatch, capsys, done, node=["a", "x"])
    assert code == 2 and err.splitlines()[-1] == "tetherctl: timed out after 1s: waiting for x to enroll"
