"""Output shaping: numbers stay numbers, *_ms become RFC 3339 strings, tables plain off a terminal."""

from __future__ import annotations

import argparse
import io
import json

import pytest
import yaml

from tether.controller.cli import describe
from tether.controller.cli.main import _parser, main
from tether.controller.cli.output import plain, rfc3339, shape, shape_times, table
from tether.nodeagent.model import Event, EventKind
from tether.v1 import admin_pb2, common_pb2

T = 1714564800123  # 2024-05-01T12:00:00.123Z


def test_rfc3339_keeps_milliseconds_and_never_is_null() -> None:
    assert rfc3339(T) == "2024-05-01T12:00:00.123Z"
    assert rfc3339(T - 123) == "2024-05-01T12:00:00.000Z"
    assert rfc3339(0) is None


def test_shape_numbers_times_maps_and_unset_messages() -> None:
    node = admin_pb2.Node(name="n", last_seen_ms=T, plan_generation=2**40, stored_seq=7)
    node.steps.add(name="s", updated_ms=T, observed={"k": "v"}, attempt=2)
    got = shape(node)
    assert got["plan_generation"] == 2**40 and got["stored_seq"] == 7  # numbers, not "1099511627776"
    assert got["last_seen"] == "2024-05-01T12:00:00.123Z" and got["enrolled"] is None
    assert not [k for k in got if k.endswith("_ms")]
    assert got["facts"] is None and got["health"] is None  # never reported: null, not zeros
    assert got["steps"] == [
        {
            "name": "s",
            "digest": "",
            "state": "",
            "exit_code": 0,
            "updated": "2024-05-01T12:00:00.123Z",
            "component": "",
            "requested": {},
            "observed": {"k": "v"},
            "attempt": 2,
            "message": "",
        }
    ]
    node.health.CopyFrom(common_pb2.Health(time_ms=T, memory_total_bytes=2**33))
    assert shape(node)["health"]["time"] == rfc3339(T)
    assert shape(node)["health"]["memory_total_bytes"] == 2**33
    json.dumps(got)  # and it is JSON as it is


def test_a_time_whose_bare_name_is_taken_gets_at() -> None:
    r = shape(admin_pb2.Rollout(updated=3, updated_ms=T, started_ms=T))
    assert r["updated"] == 3 and r["updated_at"] == rfc3339(T) and r["started"] == rfc3339(T)


def test_events_convert_at_the_edge() -> None:
    e = Event(kind=EventKind.SUCCEEDED, step="s", seq=4, time_ms=T, plan_generation=3, exit_code=0)
    got = shape_times(e.to_json())
    assert got["time"] == rfc3339(T) and "time_ms" not in got
    assert got["seq"] == 4 and got["plan_generation"] == 3 and got["kind"] == "succeeded"
    assert "time_ms" in e.to_json()  # the agent's own JSON is left alone


def test_yaml_keeps_times_as_strings() -> None:
    doc = yaml.safe_load(yaml.safe_dump(shape(admin_pb2.Token(id="t", expires_ms=T))))
    assert doc["expires"] == "2024-05-01T12:00:00.123Z"  # a str, not a YAML timestamp


def test_table_off_a_terminal_is_plain_aligned_and_unwrapped() -> None:
    out = io.StringIO()
    table([("a", "provisioned", "x" * 150), ("bbb", "failed", None)], ("NAME", "STATE", "NOTE"), out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "NAME  STATE        NOTE"
    assert lines[1] == "a     provisioned  " + "x" * 150  # never wrapped at 80 columns
    assert lines[2] == "bbb   failed"  # no trailing blanks
    assert "\x1b[" not in out.getvalue()


def test_describe_fits_120_columns() -> None:
    n = admin_pb2.Node(name="n1", environment="e", role="worker", state="failed", connected=True)
    n.facts.addresses.extend([f"10.0.0.{i}" for i in range(60)])
    n.steps.add(name="probe", state="failed", exit_code=3, attempt=1, message="m " * 200)
    n.steps[0].observed.update({f"key{i}": "v" * 40 for i in range(10)})
    n.steps[0].observed["huge"] = "y" * 500
    out = io.StringIO()
    describe.node(n, out)
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 120
    assert "10.0.0.59" in text and "key9=" + "v" * 40 in text
    assert text.replace("\n", "").replace(" ", "").count("y" * 500) == 1  # wrapped, nothing cut


def _parsers(p: argparse.ArgumentParser, path: str = "tetherctl"):  # type: ignore[no-untyped-def]
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_help_texts_have_no_rst_markup() -> None:
    seen = 0
    for path, p in _parsers(_parser()):
        text = p.format_help()
        assert "``" not in text and ":class:" not in text and ":func:" not in text, path
        seen += 1
    assert seen > 30
    assert plain("``tetherctl``: x") == "tetherctl: x"


def test_bare_tetherctl_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: tetherctl") and "completion" in out and "version" in out
