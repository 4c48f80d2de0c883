"""The SQLite store: idempotent events, contiguous acks, plans, atomic enrollment."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tether.controller.errors import TokenRejected
from tether.controller.store import NodeRecord, SqliteStore
from tether.controller.tokens import TokenRecord
from tether.nodeagent.model import Event, EventKind, Plan, Step


@pytest.fixture
async def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = SqliteStore(tmp_path / "t.db")
    yield s
    await s.close()


def node(name: str = "n1", **kw: object) -> NodeRecord:
    base: dict[str, object] = dict(
        name=name,
        environment="e",
        role="worker",
        cert_fingerprint="fp",
        key_hash="kh",
        token_id="tok",
        enrolled_ms=1,
    )
    base.update(kw)
    return NodeRecord(**base)  # type: ignore[arg-type]


def token(**kw: object) -> TokenRecord:
    base: dict[str, object] = dict(
        id="tok",
        secret_hash="h",
        environment="e",
        role="worker",
        node_name="",
        expires_ms=10**15,
        max_uses=1,
        uses=0,
        revoked=False,
        created_ms=1,
    )
    base.update(kw)
    return TokenRecord(**base)  # type: ignore[arg-type]


async def enroll(store: SqliteStore, name: str = "n1") -> None:
    await store.put_token(token(id=f"tok-{name}"))
    await store.enroll_node(f"tok-{name}", name, lambda t, e: (node(name, token_id=f"tok-{name}"), True))


def ev(seq: int, kind: EventKind = EventKind.OUTPUT, step: str = "s", digest: str = "d") -> Event:
    return Event(kind=kind, seq=seq, step=step, digest=digest, time_ms=seq, lines=(f"l{seq}",))


async def test_events_are_stored_once_by_node_and_seq(store: SqliteStore) -> None:
    await enroll(store)
    assert await store.append_events("n1", [ev(1), ev(2)]) == 2
    assert await store.append_events("n1", [ev(1), ev(2), ev(3)]) == 3  # a resend after a lost ack
    assert [e.seq for e in store.list_events("n1")] == [1, 2, 3]
    assert store.list_events("n1", after_seq=2)[0].lines == ("l3",)


async def test_ack_stays_at_the_last_contiguous_seq_until_the_gap_fills(store: SqliteStore) -> None:
    await enroll(store)
    assert await store.append_events("n1", [ev(1), ev(3)]) == 1
    assert await store.append_events("n1", [ev(2)]) == 3
    assert [e.seq for e in store.list_events("n1")] == [1, 2, 3]


async def test_events_survive_reopen(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "t.db")
    await enroll(s)
    await s.append_events("n1", [ev(1), ev(2)])
    await s.close()
    s = SqliteStore(tmp_path / "t.db")
    try:
        assert s.get_node("n1").stored_seq == 2  # type: ignore[union-attr]
        assert len(s.list_events("n1")) == 2
    finally:
        await s.close()


async def test_concurrent_writers_are_group_committed(store: SqliteStore) -> None:
    for i in range(20):
        await enroll(store, f"n{i}")
    results = await asyncio.gather(*[store.append_events(f"n{i}", [ev(1), ev(2)]) for i in range(20)])
    assert results == [2] * 20


async def test_a_failing_write_does_not_undo_its_neighbours(store: SqliteStore) -> None:
    await enroll(store)
    ok = store.append_events("n1", [ev(1)])
    bad = store.append_events("ghost", [ev(1)])
    results = await asyncio.gather(ok, bad, return_exceptions=True)
    assert results[0] == 1 and isinstance(results[1], KeyError)
    assert len(store.list_events("n1")) == 1


async def test_plan_keeps_state_of_unchanged_steps_and_resets_changed_ones(store: SqliteStore) -> None:
    await enroll(store)
    a, b = Step(name="a", script="a"), Step(name="b", script="b")
    plan1 = Plan.build([a, b], generation=1)
    await store.set_node_plan("n1", plan1)
    await store.append_events(
        "n1",
        [
            ev(1, EventKind.SUCCEEDED, "a", plan1.steps[0].digest),
            ev(2, EventKind.FAILED, "b", plan1.steps[1].digest),
        ],
    )
    assert [s.state for s in store.node_steps("n1")] == ["succeeded", "failed"]
    plan2 = Plan.build([a, Step(name="b", script="b2")], generation=2)
    await store.set_node_plan("n1", plan2)
    assert [s.state for s in store.node_steps("n1")] == ["succeeded", "pending"]
    assert store.get_node("n1").plan_generation == 2  # type: ignore[union-attr]
    # An event of the old plan's step b does not touch the new step b.
    await store.append_events("n1", [ev(3, EventKind.SUCCEEDED, "b", plan1.steps[1].digest)])
    assert store.node_steps("n1")[1].state == "pending"


async def test_enrollment_uses_the_token_atomically(store: SqliteStore) -> None:
    await store.put_token(token())

    def decide(t: TokenRecord | None, existing: NodeRecord | None) -> tuple[NodeRecord, bool]:
        assert t is not None
        if t.uses >= t.max_uses:
            raise TokenRejected("used", "used")
        return node(f"n{t.uses}"), True

    results = await asyncio.gather(
        *[store.enroll_node("tok", "n0", decide) for _ in range(5)], return_exceptions=True
    )
    assert sum(isinstance(r, NodeRecord) for r in results) == 1
    assert store.get_token("tok").uses == 1  # type: ignore[union-attr]


async def test_environment_generation_moves_only_on_change(store: SqliteStore) -> None:
    rec, changed = await store.put_environment("e", "doc1", "v1", {"a": 1})
    assert (rec.generation, changed) == (1, True)
    rec, changed = await store.put_environment("e", "doc1", "v1", {"a": 1})
    assert (rec.generation, changed) == (1, False)
    rec, changed = await store.put_environment("e", "doc2", "v1", {"a": 2})
    assert (rec.generation, changed) == (2, True)
    assert await store.delete_environment("e") and store.get_environment("e") is None


async def test_kv_put_if_absent_keeps_the_first_value(store: SqliteStore) -> None:
    assert await store.kv_put_if_absent("k", b"one") == b"one"
    assert await store.kv_put_if_absent("k", b"two") == b"one"
    await store.kv_delete("k")
    assert store.kv_get("k") is None


def test_database_files_are_private(tmp_path: Path) -> None:
    async def go() -> None:
        s = SqliteStore(tmp_path / "t.db")
        await s.close()

    asyncio.run(go())
    assert (tmp_path / "t.db").stat().st_mode & 0o077 == 0


async def test_a_failed_attempt_that_will_be_retried_is_retrying_not_failed(store: SqliteStore) -> None:
    await enroll(store)
    plan1 = Plan.build([Step(name="a", script="a")], generation=1)
    await store.set_node_plan("n1", plan1)
    d = plan1.steps[0].digest
    await store.append_events(
        "n1", [Event(kind=EventKind.FAILED, step="a", digest=d, seq=1, will_retry=True)]
    )
    assert store.node_steps("n1")[0].state == "retrying"
    await store.append_events("n1", [Event(kind=EventKind.FAILED, step="a", digest=d, seq=2)])
    assert store.node_steps("n1")[0].state == "failed"


async def test_generations_never_repeat_across_delete_and_recreate(store: SqliteStore) -> None:
    rec, _ = await store.put_environment("e", "doc-a", "v1", {"a": 1})
    assert rec.generation == 1
    await store.delete_environment("e")
    rec, changed = await store.put_environment("e", "doc-b", "v1", {"b": 1})
    assert changed and rec.generation == 2


async def test_a_fresh_enrollment_forgets_the_old_machines_steps(store: SqliteStore) -> None:
    await enroll(store)
    await store.set_node_plan("n1", Plan.build([Step(name="a", script="a")], generation=1))
    await store.append_events("n1", [ev(1, EventKind.SUCCEEDED, "a", store.node_steps("n1")[0].digest)])
    assert store.node_steps("n1")[0].state == "succeeded"
    await store.put_token(token(id="tok-2"))
    await store.enroll_node("tok-2", "n1", lambda t, e: (node("n1", token_id="tok-2", key_hash="new"), True))
    assert store.node_steps("n1") == []
    assert [e.seq for e in store.list_events("n1")] == [1]  # history stays


async def test_kv_keys_by_prefix(store: SqliteStore) -> None:
    for k in ("cluster/a/x", "cluster/a/y", "cluster/ab/z", "other"):
        await store.kv_put(k, b"1")
    assert store.kv_keys("cluster/a/") == ["cluster/a/x", "cluster/a/y"]
