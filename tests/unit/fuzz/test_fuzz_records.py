"""Fuzz the JSON record decoders: events, facts and health in the store, plans in the agent's state.

Two properties each. A record written by the encoder reads back as what was written (the
values come from random protobuf messages, so every field takes odd values). A record that is
damaged (keys gone, values of the wrong type, random JSON, random text) either reads or raises
the agent's own ``AgentError``, never a bare ``KeyError``/``TypeError``/``ValueError`` that would
surface as a traceback from whichever component read it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.unit.fuzz.pbgen import FUZZ, messages
from tether.nodeagent import wire
from tether.nodeagent.errors import AgentError
from tether.nodeagent.executor import plan_from_json, plan_to_json
from tether.nodeagent.model import Event, facts_from_dict, health_from_dict
from tether.v1 import common_pb2

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)

events = messages(common_pb2.Event).map(wire.event_from_pb)
facts = messages(common_pb2.HostFacts).map(wire.facts_from_pb)
healths = messages(common_pb2.Health).map(wire.health_from_pb)
plans = messages(common_pb2.Plan).map(wire.plan_from_pb)


@st.composite
def damaged(draw: Any, records: st.SearchStrategy[dict[str, Any]]) -> Any:
    """A record with keys dropped, values replaced and keys added; sometimes just any JSON."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    doc = dict(draw(records))
    for key in draw(st.lists(st.sampled_from(sorted(doc) or [""]), max_size=3)):
        if draw(st.booleans()):
            doc.pop(key, None)
        else:
            doc[key] = draw(json_values)
    if draw(st.booleans()):
        doc[draw(st.text(max_size=8))] = draw(json_values)
    return doc


def _reads_or_refuses(decode: Callable[[Any], Any], doc: Any) -> None:
    with contextlib.suppress(AgentError):
        decode(doc)


# -- round trips (these hold today) ---------------------------------------------------------------


@FUZZ
@given(events)
def test_event_json_round_trip(e: Event) -> None:
    back = Event.from_json(json.loads(json.dumps(e.to_json())))
    assert json.dumps(back.to_json(), sort_keys=True) == json.dumps(e.to_json(), sort_keys=True)


@FUZZ
@given(facts)
def test_facts_dict_round_trip(f: Any) -> None:
    assert facts_from_dict(json.loads(json.dumps(dataclasses.asdict(f)))) == f


@FUZZ
@given(healths)
def test_health_dict_round_trip(h: Any) -> None:
    back = health_from_dict(json.loads(json.dumps(dataclasses.asdict(h))))
    assert json.dumps(dataclasses.asdict(back), sort_keys=True) == json.dumps(
        dataclasses.asdict(h), sort_keys=True
    )


@FUZZ
@given(plans)
def test_plan_json_round_trip(p: Any) -> None:
    assert plan_from_json(plan_to_json(p)) == p


# -- damaged records ------------------------------------------------------------------------------


@FUZZ
@given(damaged(events.map(Event.to_json)))
def test_damaged_event_record(doc: Any) -> None:
    _reads_or_refuses(Event.from_json, doc)


@FUZZ
@given(damaged(facts.map(dataclasses.asdict)))
def test_damaged_facts_record(doc: Any) -> None:
    _reads_or_refuses(facts_from_dict, doc)


@FUZZ
@given(damaged(healths.map(dataclasses.asdict)))
def test_damaged_health_record(doc: Any) -> None:
    _reads_or_refuses(health_from_dict, doc)


@FUZZ
@given(damaged(plans.map(lambda p: json.loads(plan_to_json(p)))).map(json.dumps) | st.text(max_size=80))
def test_damaged_plan_record(text: str) -> None:
    _reads_or_refuses(plan_from_json, text)
