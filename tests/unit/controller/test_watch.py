"""The node watch's revision log: one change per state change, a bounded ring, resume, epochs,
environment filters and slow watchers cut off (a real SQLite store and a real hub)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from tether.controller import wire
from tether.controller.errors import OutOfRange, ResourceExhausted
from tether.controller.hub import Hub
from tether.controller.nodewatch import EPOCH_SHIFT, NodeWatch, environment_filter
from tether.controller.store import NodeRecord, SqliteStore
from tether.controller.tokens import TokenRecord
from tether.nodeagent.model import Event, EventKind, Plan, Step


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "t.db")
    yield s
    await s.close()


def node(name: str, environment: str = "e") -> NodeRecord:
    return NodeRecord(
        name=name,
        environment=environment,
        role="worker",
        cert_fingerprint="fp",
        key_hash="kh",
        token_id=f"tok-{name}",
        enrolled_ms=1,
    )


async def enroll(watch: NodeWatch, name: str, environment: str = "e") -> None:
    token = TokenRecord(
        id=f"tok-{name}",
        secret_hash="h",
        environment=environment,
        role="worker",
        node_name="",
        expires_ms=10**15,
        max_uses=1,
        uses=0,
        revoked=False,
        created_ms=1,
    )
    await watch.store.put_token(token)
    await watch.store.enroll_node(token.id, name, lambda t, e: (node(name, environment), True))


def changes(watch: NodeWatch, after: int = 0) -> list[tuple[str, str, str]]:
    _, kept = watch.subscribe(lambda env: True, after or watch.floor)
    return [(c.kind, c.reason, c.node) for c in kept]


async def test_each_state_change_is_one_change_in_order(store: SqliteStore) -> None:
    hub = Hub()
    watch = NodeWatch(store, hub)
    await watch.start()
    await enroll(watch, "n1")
    session = hub.attach("n1", "e")  # its stream is up: no plan yet
    plan = Plan.build([Step(name="a", script="a")], generation=1)
    await watch.store.set_node_plan("n1", plan)  # still provisioning: no change
    await watch.store.update_node("n1", last_seen_ms=5)  # not a state: not even looked at
    step = plan.steps[0]
    done = Event(kind=EventKind.SUCCEEDED, seq=1, step="a", digest=step.digest, time_ms=1)
    await watch.store.append_events("n1", [done])
    hub.detach(session)
    await watch.store.update_node("n1", revoked=True)
    await watch.store.delete_node("n1")
    assert changes(watch) == [
        ("added", "enrolled", "n1"),
        ("modified", "provisioning", "n1"),
        ("modified", "provisioned", "n1"),
        ("modified", "offline", "n1"),
        ("modified", "revoked", "n1"),
        ("deleted", "deleted", "n1"),
    ]
    _, kept = watch.subscribe(lambda env: True, watch.floor)
    assert [c.revision for c in kept] == [watch.floor + i for i in range(1, 7)]
    assert kept[-1].record is not None and kept[-1].record.name == "n1" and kept[-1].state == "revoked"


async def test_the_ring_is_bounded_and_an_older_revision_is_out_of_range(store: SqliteStore) -> None:
    watch = NodeWatch(store, Hub(), history=3)
    await watch.start()
    start = watch.revision
    for i in range(5):
        await enroll(watch, f"n{i}")
    assert len(watch) == 3 and watch.floor == start + 2
    with pytest.raises(OutOfRange, match=rf"revision {start + 1} is no longer kept \(oldest {start + 2}\)"):
        watch.subscribe(lambda env: True, start + 1)
    assert [c[2] for c in changes(watch, start + 2)] == ["n2", "n3", "n4"]
    with pytest.raises(OutOfRange, match="newer"):
        watch.subscribe(lambda env: True, watch.revision + 1)


async def test_a_resumed_watch_gets_what_it_missed_then_live_changes(store: SqliteStore) -> None:
    watch = NodeWatch(store, Hub())
    await watch.start()
    await enroll(watch, "a")
    seen = watch.revision
    await enroll(watch, "b")  # while it was away
    watcher, backlog = watch.subscribe(lambda env: True, seen)
    assert [c.node for c in backlog] == ["b"]
    await enroll(watch, "c")
    live = await watcher.get()
    assert (live.node, live.revision) == ("c", seen + 2)
    watch.unsubscribe(watcher)


async def test_revisions_of_an_earlier_run_are_out_of_range(store: SqliteStore) -> None:
    first = NodeWatch(store, Hub())
    await first.start()
    await enroll(first, "a")
    old = first.revision
    again = NodeWatch(store, Hub())  # a restarted controller, the same store
    await again.start()
    assert again.revision >> EPOCH_SHIFT == (old >> EPOCH_SHIFT) + 1
    with pytest.raises(OutOfRange, match="no longer kept"):
        again.subscribe(lambda env: True, old)
    await again.store.update_node("a", revoked=True)  # it knew "a" from the store at its start
    assert changes(again) == [("modified", "revoked", "a")]


async def test_a_slow_watcher_is_cut_off_and_the_others_go_on(store: SqliteStore) -> None:
    watch = NodeWatch(store, Hub(), queue=2)
    await watch.start()
    slow, _ = watch.subscribe(lambda env: True)
    fast, _ = watch.subscribe(lambda env: True)
    await enroll(watch, "a")
    assert (await fast.get()).node == "a"
    await enroll(watch, "b")
    assert (await fast.get()).node == "b"
    await enroll(watch, "c")  # the slow one holds a and b: c is one too many
    assert len(slow) == 0
    with pytest.raises(ResourceExhausted, match=rf"watch again from revision {watch.floor}"):
        await slow.get()
    await enroll(watch, "d")
    assert [(await fast.get()).node, (await fast.get()).node] == ["c", "d"]


async def test_watchers_get_only_their_environments(store: SqliteStore) -> None:
    watch = NodeWatch(store, Hub())
    await watch.start()
    one, _ = watch.subscribe(environment_filter("x"))
    scoped, _ = watch.subscribe(environment_filter("", allowed=["y"]))
    await enroll(watch, "a", "x")
    await enroll(watch, "b", "y")
    assert (await one.get()).node == "a" and len(one) == 0
    assert (await scoped.get()).node == "b" and len(scoped) == 0
    assert environment_filter("x", allowed=["y"])("x") is False  # outside the scope: nothing


async def test_the_stream_lists_syncs_then_follows(store: SqliteStore) -> None:
    watch = NodeWatch(store, Hub())
    await watch.start()
    await enroll(watch, "b")
    await enroll(watch, "a")

    def node_pb(record: NodeRecord) -> wire.admin.Node:
        return wire.admin.Node(name=record.name, environment=record.environment, state="offline")

    stream = watch.events("", 0, (), node_pb)
    first = [await anext(stream) for _ in range(3)]
    assert [(e.type, e.node.name) for e in first] == [
        (wire.admin.NODE_EVENT_TYPE_ADDED, "a"),
        (wire.admin.NODE_EVENT_TYPE_ADDED, "b"),
        (wire.admin.NODE_EVENT_TYPE_SYNCED, ""),
    ]
    assert first[2].revision == watch.revision
    await watch.store.delete_node("a")
    gone = await asyncio.wait_for(anext(stream), 10)
    assert (gone.type, gone.reason, gone.node.name, gone.revision) == (
        wire.admin.NODE_EVENT_TYPE_DELETED,
        "deleted",
        "a",
        watch.revision,
    )
    await stream.aclose()
    assert not watch._watchers  # the call's end lets its watcher go


async def test_a_machine_enrolled_again_elsewhere_leaves_one_environment_for_another(
    store: SqliteStore,
) -> None:
    watch = NodeWatch(store, Hub())
    await watch.start()
    await enroll(watch, "n1", "x")
    again = replace(node("n1", "y"), enrolled_ms=2, token_id="tok-n1")
    await watch.store.enroll_node("tok-n1", "n1", lambda t, e: (again, True))
    _, kept = watch.subscribe(lambda env: True, watch.floor)
    assert [(c.kind, c.reason, c.environment, c.state) for c in kept] == [
        ("added", "enrolled", "x", "offline"),
        ("deleted", "deleted", "x", "offline"),
        ("added", "enrolled", "y", "offline"),
    ]
