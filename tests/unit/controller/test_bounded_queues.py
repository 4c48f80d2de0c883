"""Issue 10, item 9: follower queues bounded in bytes, the plan cache bounded in entries."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import grpc
import pytest

from tether.controller.follower import FellBehind, Follower, event_bytes
from tether.controller.hub import Hub
from tether.controller.limits import PLAN_CACHE_ENTRIES
from tether.controller.planner import Planner
from tether.controller.render.targets import facts_for
from tether.controller.spec import load_document
from tether.controller.store.records import EnvironmentRecord
from tether.nodeagent.model import Event, EventKind

DOCUMENT = (
    "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata:\n  name: e\n"
    "spec:\n  customTemplates:\n    - name: noop\n      inline: 'true'\n"
)


def _output(seq: int, node: str = "n1", line_bytes: int = 1000) -> Event:
    return Event(EventKind.OUTPUT, step="s", seq=seq, node=node, lines=("x" * line_bytes,))


def test_a_follower_over_its_bytes_is_cut_off_and_holds_nothing() -> None:
    hub = Hub()
    follower = hub.follow(["node:n1"], limit_bytes=64 * 1024)
    events = [_output(seq) for seq in range(1, 201)]  # ~1.3 KB each: well over 64 KiB in all
    hub.publish("n1", "e", events)
    assert follower.cut_off is not None
    assert len(follower) == 0 and follower.queued_bytes == 0
    assert not hub._followers  # it gets nothing more
    hub.publish("n1", "e", [_output(500)])
    assert len(follower) == 0

    with pytest.raises(FellBehind) as exc:
        asyncio.run(follower.get())
    assert exc.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "fell behind by more than 65536 bytes" in str(exc.value)
    assert "node 'n1' from seq 1" in str(exc.value)


def test_a_follower_that_keeps_up_gets_every_event_in_order() -> None:
    follower = Follower(limit_bytes=8 * 1024)

    async def main() -> list[int]:
        got: list[int] = []
        for seq in range(1, 101):
            follower.put(_output(seq, line_bytes=500))
            got.append((await follower.get()).seq)
        return got

    assert asyncio.run(main()) == list(range(1, 101))
    assert follower.cut_off is None and follower.queued_bytes == 0


def test_the_cut_off_names_the_first_event_it_did_not_get() -> None:
    follower = Follower(limit_bytes=10 * event_bytes(_output(1)))

    async def main() -> int:
        for seq in range(1, 4):
            follower.put(_output(seq))
        await follower.get()  # seq 1 delivered; 2 and 3 still queued
        for seq in range(4, 20):
            follower.put(_output(seq))
        return len(follower)

    assert asyncio.run(main()) == 0
    assert "from seq 2" in str(follower.cut_off)


def test_event_size_counts_the_lines() -> None:
    small, big = _output(1, line_bytes=10), _output(1, line_bytes=100_000)
    assert event_bytes(big) - event_bytes(small) == 100_000 - 10


class _Store:
    def __init__(self) -> None:
        loaded = load_document(DOCUMENT)
        self.env = EnvironmentRecord("e", DOCUMENT, loaded.api_version, loaded.normalized, 1, 0, 0)

    def get_environment(self, name: str) -> EnvironmentRecord | None:
        return self.env if name == "e" else None


def test_the_plan_cache_is_bounded_when_a_fact_varies() -> None:
    planner = Planner(_Store())  # type: ignore[arg-type]
    base = facts_for("ubuntu-22.04")
    for i in range(PLAN_CACHE_ENTRIES + 50):
        planner.plan("e", "worker", replace(base, kernel=f"6.8.0-{i}-generic"))
    assert len(planner._plans) == PLAN_CACHE_ENTRIES


def test_the_plan_cache_keeps_the_most_recently_used() -> None:
    planner = Planner(_Store(), cache_size=2)  # type: ignore[arg-type]
    facts: list[Any] = [replace(facts_for("ubuntu-22.04"), kernel=k) for k in ("a", "b", "c")]
    first = planner.plan("e", "worker", facts[0])
    planner.plan("e", "worker", facts[1])
    assert planner.plan("e", "worker", facts[0]) is first  # used again: now the most recent
    planner.plan("e", "worker", facts[2])  # evicts "b", not "a"
    assert planner.plan("e", "worker", facts[0]) is first


def test_an_applied_spec_is_remembered_without_parsing_again(monkeypatch: pytest.MonkeyPatch) -> None:
    store = _Store()
    planner = Planner(store)  # type: ignore[arg-type]
    planner.remember(store.env, load_document(DOCUMENT))

    def parse_again(document: str) -> None:
        raise AssertionError("parsed again")

    monkeypatch.setattr("tether.controller.planner.load_document", parse_again)
    assert planner.spec(store.env).spec.name == "e"
