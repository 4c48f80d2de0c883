"""Fuzz every protobuf decoder with what a hostile peer can send (issue 10, "Also": fuzz targets).

Bytes come from ``pbgen.wire_bytes``: valid messages with any field values, mangled ones and
random ones. Parsing may refuse them (``DecodeError``: grpc answers the call with an error);
whatever parses must decode without an exception, and a decoded event, facts or health must
survive the JSON round trip the store and the agent's journal put them through.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf.message import DecodeError, Message
from hypothesis import given

from tests.unit.fuzz.pbgen import FUZZ, wire_bytes
from tether.bootstrap.errors import ControllerError as BootstrapControllerError
from tether.controller import wire
from tether.controller.cli import bootstrap_admin
from tether.nodeagent import wire as agent_wire
from tether.nodeagent.model import Event, facts_from_dict, health_from_dict
from tether.v1 import admin_pb2, agent_pb2, common_pb2


def _parse(cls: type[Message], data: bytes) -> Message | None:
    msg = cls()
    try:
        msg.ParseFromString(data)
    except DecodeError:
        return None
    return msg


def _same_json(a: Any, b: Any) -> bool:
    """Equal as the store writes them (NaN included, which ``==`` never equals)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _check_event(m: common_pb2.Event) -> None:
    e = wire.event_from_pb(m)
    doc = json.loads(json.dumps(e.to_json()))
    assert _same_json(Event.from_json(doc).to_json(), e.to_json())
    wire.event_to_pb(e)


def _check_facts(m: common_pb2.HostFacts) -> None:
    f = wire.facts_from_pb(m)
    doc = json.loads(json.dumps(dataclasses.asdict(f)))
    assert facts_from_dict(doc) == f
    wire.facts_to_pb(f)


def _check_health(m: common_pb2.Health) -> None:
    h = wire.health_from_pb(m)
    doc = json.loads(json.dumps(dataclasses.asdict(h)))
    assert _same_json(dataclasses.asdict(health_from_dict(doc)), dataclasses.asdict(h))
    wire.health_to_pb(h)


def _check_plan(m: common_pb2.Plan) -> None:
    p = wire.plan_from_pb(m)
    assert wire.plan_from_pb(wire.plan_to_pb(p)) == p


def _check_step(m: common_pb2.Step) -> None:
    s = wire.step_from_pb(m)
    s.compute_digest()
    assert wire.step_from_pb(wire.step_to_pb(s)) == s


def _check_agent_message(m: agent_pb2.AgentMessage) -> None:
    """What the controller decodes from an agent's stream."""
    kind = m.WhichOneof("kind")
    if kind == "hello":
        _check_facts(m.hello.facts)
    elif kind == "events":
        for e in m.events.events:
            _check_event(e)
    elif kind == "health":
        _check_health(m.health)


def _check_controller_message(m: agent_pb2.ControllerMessage) -> None:
    """What the agent decodes from the controller's stream."""
    kind = m.WhichOneof("kind")
    if kind == "plan":
        _check_plan(m.plan)
    elif kind == "command" and m.command.WhichOneof("kind") == "task":
        _check_step(m.command.task.step)


CASES: dict[str, tuple[type[Message], Callable[[Any], None]]] = {
    "event_from_pb": (common_pb2.Event, _check_event),
    "facts_from_pb": (common_pb2.HostFacts, _check_facts),
    "health_from_pb": (common_pb2.Health, _check_health),
    "plan_from_pb": (common_pb2.Plan, _check_plan),
    "step_from_pb": (common_pb2.Step, _check_step),
    "gpu_from_pb": (common_pb2.Gpu, agent_wire.gpu_from_pb),
    "cluster_from_pb": (common_pb2.ClusterView, agent_wire.cluster_from_pb),
    "AgentMessage": (agent_pb2.AgentMessage, _check_agent_message),
    "ControllerMessage": (agent_pb2.ControllerMessage, _check_controller_message),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_decoders_take_anything_that_parses(name: str) -> None:
    cls, check = CASES[name]

    @FUZZ
    @given(wire_bytes(cls))
    def run(data: bytes) -> None:
        msg = _parse(cls, data)
        if msg is not None:
            check(msg)

    run()


@FUZZ
@given(wire_bytes(admin_pb2.BootstrapEvent))
def test_bootstrap_event_from_pb_takes_anything_that_parses(data: bytes) -> None:
    msg = _parse(admin_pb2.BootstrapEvent, data)
    if msg is not None:
        with contextlib.suppress(BootstrapControllerError):  # ours: one line in tetherctl
            bootstrap_admin.event_from_pb(msg)
