"""The store contract: every backend passes these (tests/unit/controller/test_store.py runs them on
SQLite, tests/integration/test_store_postgres.py on a scratch PostgreSQL).

A module importing them (``from tests.store_contract import *``) provides a ``store_location``
fixture: a SQLite path or a postgresql:// URL of an empty database.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tether.controller.errors import Aborted, TokenRejected
from tether.controller.store import NodeRecord, Store, open_store
from tether.controller.store import base as store_base
from tether.controller.store.records import AuditRecord
from tether.controller.tokens import TokenRecord
from tether.nodeagent.model import Event, EventKind, Plan, Step

STORE_KEY = bytes(range(32))  # as --store-key-file's: PostgreSQL stores sign their notices with it


@pytest.fixture
async def store(store_location: str | Path) -> AsyncIterator[Store]:
    s = await open_store(store_location, notify_key=STORE_KEY)
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


async def enroll(store: Store, name: str = "n1", environment: str = "e") -> None:
    await store.put_token(token(id=f"tok-{name}", environment=environment))
    record = node(name, token_id=f"tok-{name}", environment=environment)
    await store.enroll_node(f"tok-{name}", name, lambda t, e: (record, True))


def ev(seq: int, kind: EventKind = EventKind.OUTPUT, step: str = "s", digest: str = "d") -> Event:
    return Event(kind=kind, seq=seq, step=step, digest=digest, time_ms=seq, lines=(f"l{seq}",))


def audit_record(i: int, environment: str, outcome: str = "ok") -> AuditRecord:
    return AuditRecord(0, 1000 + i, "ci", "ab" * 32, "CreateToken", environment, "", 0, 0, outcome, f"n{i}")


# -- events -------------------------------------------------------------------------------------------


async def test_events_are_stored_once_by_node_and_seq(store: Store) -> None:
    await enroll(store)
    assert await store.append_events("n1", [ev(1), ev(2)]) == 2
    assert await store.append_events("n1", [ev(1), ev(2), ev(3)]) == 3  # a resend after a lost ack
    assert [e.seq for e in await store.list_events("n1")] == [1, 2, 3]
    assert (await store.list_events("n1", after_seq=2))[0].lines == ("l3",)
    assert [e.seq for e in await store.list_events("n1", after_seq=0, limit=2)] == [1, 2]
    assert store.max_seq("n1") == 3 and store.get_node("n1").stored_seq == 3  # type: ignore[union-attr]


async def test_ack_stays_at_the_last_contiguous_seq_until_the_gap_fills(store: Store) -> None:
    await enroll(store)
    assert await store.append_events("n1", [ev(1), ev(3)]) == 1
    assert store.max_seq("n1") == 3
    assert await store.append_events("n1", [ev(2)]) == 3
    assert [e.seq for e in await store.list_events("n1")] == [1, 2, 3]


async def test_events_survive_reopen(store_location: str | Path) -> None:
    s = await open_store(store_location, notify_key=STORE_KEY)
    await enroll(s)
    await s.append_events("n1", [ev(1), ev(2)])
    await s.close()
    s = await open_store(store_location, notify_key=STORE_KEY)
    try:
        assert s.get_node("n1").stored_seq == 2  # type: ignore[union-attr]
        assert len(await s.list_events("n1")) == 2 and s.max_seq("n1") == 2
    finally:
        await s.close()


async def test_concurrent_appends_each_get_their_own_answer(store: Store) -> None:
    for i in range(20):
        await enroll(store, f"n{i}")
    results = await asyncio.gather(*[store.append_events(f"n{i}", [ev(1), ev(2)]) for i in range(20)])
    assert results == [2] * 20
    same = await asyncio.gather(*[store.append_events("n0", [ev(s)]) for s in (3, 5, 4)])
    assert same == [3, 3, 5] and store.get_node("n0").stored_seq == 5  # type: ignore[union-attr]


async def test_a_failing_write_does_not_undo_its_neighbours(store: Store) -> None:
    await enroll(store)
    ok = store.append_events("n1", [ev(1)])
    bad = store.append_events("ghost", [ev(1)])
    results = await asyncio.gather(ok, bad, return_exceptions=True)
    assert results[0] == 1 and isinstance(results[1], KeyError)
    assert len(await store.list_events("n1")) == 1


async def test_an_acked_boundary_ahead_of_the_store_is_taken_with_one_gap_event(store: Store) -> None:
    await enroll(store)
    await store.append_events("n1", [ev(1)])
    assert await store.accept_acked("n1", 1) == 1  # not behind: nothing happens
    assert await store.accept_acked("n1", 5) == 5
    stored = await store.list_events("n1")
    assert [e.seq for e in stored] == [1, 2] and "2..5" in stored[1].message
    assert store.get_node("n1").stored_seq == 5  # type: ignore[union-attr]
    assert await store.append_events("n1", [ev(6)]) == 6
    with pytest.raises(KeyError):
        await store.accept_acked("ghost", 3)


async def test_any_text_an_agent_sends_is_stored(store: Store) -> None:
    await enroll(store)
    await store.set_node_plan("n1", Plan.build([Step(name="a", script="a")], generation=1))
    d = store.node_steps("n1")[0].digest
    odd = Event(
        kind=EventKind.FAILED, seq=1, step="a", digest=d, message="nul\x00 ünï \U0001f600", lines=("\x00",)
    )
    weird_step = Event(kind=EventKind.STARTED, seq=2, step="b\x00", digest="x\x00")
    assert await store.append_events("n1", [odd, weird_step]) == 2
    stored = await store.list_events("n1")
    assert [e.seq for e in stored] == [1, 2] and stored[0].lines == ("\x00",)
    assert store.node_steps("n1")[0].state == "failed" and "ünï" in store.node_steps("n1")[0].message


# -- plans and steps ------------------------------------------------------------------------------------


async def test_plan_keeps_state_of_unchanged_steps_and_resets_changed_ones(store: Store) -> None:
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


async def test_a_failed_attempt_that_will_be_retried_is_retrying_not_failed(store: Store) -> None:
    await enroll(store)
    plan1 = Plan.build([Step(name="a", script="a")], generation=1)
    await store.set_node_plan("n1", plan1)
    d = plan1.steps[0].digest
    await store.append_events(
        "n1", [Event(kind=EventKind.FAILED, step="a", digest=d, seq=1, will_retry=True)]
    )
    assert store.node_steps("n1")[0].state == "retrying"
    await store.append_events(
        "n1", [Event(kind=EventKind.FAILED, step="a", digest=d, seq=2, exit_code=3, observed={"k": "v"})]
    )
    step = store.node_steps("n1")[0]
    assert (step.state, step.exit_code, step.observed) == ("failed", 3, {"k": "v"})


async def test_reset_steps_sets_them_pending(store: Store) -> None:
    await enroll(store)
    plan = Plan.build([Step(name="a", script="a"), Step(name="b", script="b")], generation=1)
    await store.set_node_plan("n1", plan)
    done = [ev(i + 1, EventKind.SUCCEEDED, s.name, s.digest) for i, s in enumerate(plan.steps)]
    await store.append_events("n1", done)
    await store.reset_steps("n1", ["b"])
    assert [s.state for s in store.node_steps("n1")] == ["succeeded", "pending"]
    await store.reset_steps("n1", [])
    assert [s.state for s in store.node_steps("n1")] == ["pending", "pending"]


# -- tokens and enrollment ------------------------------------------------------------------------------


async def test_enrollment_uses_the_token_atomically(store: Store) -> None:
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


async def test_many_enrollments_on_one_token_count_every_use(store: Store) -> None:
    await store.put_token(token(max_uses=30))

    def decide(t: TokenRecord | None, existing: NodeRecord | None) -> tuple[NodeRecord, bool]:
        assert t is not None and existing is None
        if t.uses >= t.max_uses:
            raise TokenRejected("used", "used")
        return node(f"m{t.uses}"), True

    results = await asyncio.gather(
        *[store.enroll_node("tok", f"x{i}", decide) for i in range(40)], return_exceptions=True
    )
    assert sum(isinstance(r, NodeRecord) for r in results) == 30
    assert store.get_token("tok").uses == 30  # type: ignore[union-attr]


async def test_a_retry_by_the_same_node_is_not_a_second_use(store: Store) -> None:
    await store.put_token(token(max_uses=1))
    seen: list[NodeRecord | None] = []

    def decide(t: TokenRecord | None, existing: NodeRecord | None) -> tuple[NodeRecord, bool]:
        seen.append(existing)
        return node("n1", facts={"try": len(seen)}), existing is None

    await store.enroll_node("tok", "n1", decide)
    again = await store.enroll_node("tok", "n1", decide)
    assert seen[0] is None and seen[1] is not None and seen[1].facts == {"try": 1}
    assert again.facts == {"try": 2} and store.get_node("n1").facts == {"try": 2}  # type: ignore[union-attr]
    assert store.get_token("tok").uses == 1  # type: ignore[union-attr]


async def test_a_fresh_enrollment_forgets_the_old_machines_steps_and_hardware(store: Store) -> None:
    await enroll(store)
    await store.set_node_plan("n1", Plan.build([Step(name="a", script="a")], generation=1))
    await store.append_events("n1", [ev(1, EventKind.SUCCEEDED, "a", store.node_steps("n1")[0].digest)])
    await store.patch_node_hardware("n1", {"quarantine": {"reason": "x"}})
    assert store.node_steps("n1")[0].state == "succeeded"
    await store.put_token(token(id="tok-2"))
    await store.enroll_node(
        "tok-2", "n1", lambda t, e: (node("n1", token_id="tok-2", hardware=e.hardware), True)
    )  # type: ignore[union-attr]
    assert store.node_steps("n1") == [] and store.get_node("n1").hardware == {}  # type: ignore[union-attr]
    assert [e.seq for e in await store.list_events("n1")] == [1]  # history stays


async def test_tokens_are_listed_by_creation_and_revoked(store: Store) -> None:
    await store.put_token(token(id="b", created_ms=2, environment="x"))
    await store.put_token(token(id="a", created_ms=3, environment="y"))
    await store.put_token(token(id="c", created_ms=1, environment="x"))
    assert [t.id for t in store.list_tokens()] == ["c", "b", "a"]
    assert [t.id for t in store.list_tokens("x")] == ["c", "b"]
    assert await store.revoke_token("b") and store.get_token("b").revoked  # type: ignore[union-attr]
    assert not await store.revoke_token("nope") and store.get_token("nope") is None


# -- nodes ----------------------------------------------------------------------------------------------


async def test_nodes_are_listed_by_name_and_paged(store: Store) -> None:
    for name, env in (("c", "x"), ("a", "x"), ("d", "y"), ("b", "y")):
        await enroll(store, name, env)
    assert [n.name for n in store.list_nodes()] == ["a", "b", "c", "d"]
    assert [n.name for n in store.list_nodes("y")] == ["b", "d"]
    assert [n.name for n in store.list_nodes_page("", "a", 2)] == ["b", "c"]
    assert [n.name for n in store.list_nodes_page("x", "", 5)] == ["a", "c"]
    assert [n.name for n in store.list_nodes_page("y", "b", 5)] == ["d"]


async def test_update_node_sets_fields_and_refuses_unknown_ones(store: Store) -> None:
    await enroll(store)
    await store.update_node("n1", health={"ok": True}, last_seen_ms=7, revoked=True, agent_version="1.2")
    n = store.get_node("n1")
    assert n is not None and (n.health, n.last_seen_ms, n.revoked, n.agent_version) == (
        {"ok": True},
        7,
        True,
        "1.2",
    )
    with pytest.raises(ValueError, match="unknown"):
        await store.update_node("n1", stored_seq=4)
    await store.update_node("ghost", last_seen_ms=1)  # nobody: nothing


async def test_hardware_patches_never_overwrite_each_other(store: Store) -> None:
    await enroll(store)
    await asyncio.gather(
        *[store.patch_node_hardware("n1", {f"k{i}": {"i": i}}) for i in range(10)],
    )
    assert set(store.get_node("n1").hardware) == {f"k{i}" for i in range(10)}  # type: ignore[union-attr]
    await store.patch_node_hardware("n1", {"k0": None, "k1": {"i": 11}})
    hw = store.get_node("n1").hardware  # type: ignore[union-attr]
    assert "k0" not in hw and hw["k1"] == {"i": 11}


async def test_delete_node_removes_its_record_steps_and_events_and_nothing_else(store: Store) -> None:
    for name in ("n1", "n2"):
        await enroll(store, name)
        await store.set_node_plan(name, Plan.build([Step(name="a", script="true")]))
        await store.append_events(name, [ev(1, EventKind.SUCCEEDED, "a"), ev(2)])
    assert await store.delete_node("n1")
    assert store.get_node("n1") is None
    assert store.node_steps("n1") == [] and await store.list_events("n1") == [] and store.max_seq("n1") == 0
    assert [n.name for n in store.list_nodes()] == ["n2"]
    assert len(store.node_steps("n2")) == 1 and [e.seq for e in await store.list_events("n2")] == [1, 2]
    assert not await store.delete_node("n1")  # gone already
    await store.put_token(token(id="tok-again"))  # enrolled again: a fresh history
    await store.enroll_node("tok-again", "n1", lambda t, e: (node("n1", token_id="tok-again"), True))
    assert await store.list_events("n1") == [] and await store.append_events("n1", [ev(1)]) == 1


# -- environments ---------------------------------------------------------------------------------------


async def test_environment_generation_moves_only_on_change(store: Store) -> None:
    rec, changed = await store.put_environment("e", "doc1", "v1", {"a": 1})
    assert (rec.generation, changed) == (1, True)
    rec, changed = await store.put_environment("e", "doc1", "v1", {"a": 1})
    assert (rec.generation, changed) == (1, False)
    rec, changed = await store.put_environment("e", "doc2", "v1", {"a": 2})
    assert (rec.generation, changed) == (2, True)
    assert store.get_environment("e") == rec and [e.name for e in store.list_environments()] == ["e"]
    assert await store.delete_environment("e") and store.get_environment("e") is None
    assert not await store.delete_environment("e")


async def test_an_expected_generation_is_checked_in_the_write(store: Store) -> None:
    await store.put_environment("e", "doc1", "v1", {"a": 1})
    with pytest.raises(Aborted, match="generation 1, not 5"):
        await store.put_environment("e", "doc2", "v1", {"a": 2}, expected_generation=5)
    with pytest.raises(Aborted, match="does not exist"):
        await store.put_environment("new", "doc", "v1", {}, expected_generation=1)
    results = await asyncio.gather(
        *[store.put_environment("e", f"doc-{i}", "v1", {"i": i}, expected_generation=1) for i in range(4)],
        return_exceptions=True,
    )
    assert sum(not isinstance(r, BaseException) for r in results) == 1  # one wins, the rest are Aborted
    assert all(isinstance(r, Aborted) for r in results if isinstance(r, BaseException))
    assert store.get_environment("e").generation == 2  # type: ignore[union-attr]


async def test_generations_never_repeat_across_delete_and_recreate(store: Store) -> None:
    rec, _ = await store.put_environment("e", "doc-a", "v1", {"a": 1})
    assert rec.generation == 1
    await store.delete_environment("e")
    rec, changed = await store.put_environment("e", "doc-b", "v1", {"b": 1})
    assert changed and rec.generation == 2


async def test_every_generation_is_kept_and_the_agent_version_makes_one(store: Store) -> None:
    a, _ = await store.put_environment("gpu", "doc-a", "v", {"x": 1})
    b, _ = await store.put_environment("gpu", "doc-b", "v", {"x": 2})
    same, changed = await store.put_environment("gpu", "doc-b", "v", {"x": 2})
    assert not changed and same.generation == b.generation
    up, changed = await store.put_environment("gpu", "doc-b", "v", {"x": 2}, agent_version="0.2.0")
    assert changed and up.generation == b.generation + 1 and up.agent_version == "0.2.0"
    kept, _ = await store.put_environment("gpu", "doc-c", "v", {"x": 3})
    assert kept.agent_version == "0.2.0"  # None keeps it
    old = store.get_revision("gpu", a.generation)
    assert old is not None and old.document == "doc-a" and old.spec == {"x": 1}
    assert store.get_revision("gpu", 99) is None
    assert await store.delete_environment("gpu")
    assert store.get_revision("gpu", a.generation) is None


async def test_old_revisions_are_pruned_past_the_ones_kept_unless_a_node_runs_one(store: Store) -> None:
    keep = store_base.KEEP_REVISIONS
    await enroll(store, "n1", "gpu")
    for i in range(keep + 5):
        await store.put_environment("gpu", f"doc-{i}", "v", {"i": i})
        if i == 2:
            await store.set_node_plan("n1", Plan.build([], generation=3))  # n1 runs generation 3
    assert store.get_revision("gpu", 1) is None and store.get_revision("gpu", 2) is None
    assert store.get_revision("gpu", 3) is not None  # a node still runs it
    assert store.get_revision("gpu", 6) is not None and store.get_revision("gpu", keep + 5)


# -- audit log ------------------------------------------------------------------------------------------


async def test_audit_records_are_kept_newest_first_filtered_and_bounded(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = [await store.append_audit(audit_record(i, "lab" if i % 2 else "prod")) for i in range(6)]
    assert [r.id for r in stored] == [1, 2, 3, 4, 5, 6]
    assert [r.id for r in await store.list_audit()] == [6, 5, 4, 3, 2, 1]
    assert [r.id for r in await store.list_audit(before_id=5, limit=2)] == [4, 3]
    assert [r.id for r in await store.list_audit("lab")] == [6, 4, 2]
    assert [r.id for r in await store.list_audit(environments=["prod"])] == [5, 3, 1]
    assert await store.list_audit("lab", environments=["prod"]) == []
    assert (await store.list_audit())[0] == AuditRecord(
        6, 1005, "ci", "ab" * 32, "CreateToken", "lab", "", 0, 0, "ok", "n5"
    )
    monkeypatch.setattr(store_base, "KEEP_AUDIT_RECORDS", 4)
    monkeypatch.setattr(store_base, "KEEP_AUDIT_REFUSALS", 1)
    await store.append_audit(audit_record(6, "lab"))
    assert [r.id for r in await store.list_audit()] == [7, 6, 5, 4]  # the oldest go first; ids never repeat
    await store.append_audit(audit_record(7, "lab", "PERMISSION_DENIED"))
    await store.append_audit(audit_record(8, "lab", "ABORTED"))
    assert [r.id for r in await store.list_audit()] == [9, 7, 6, 5, 4]  # a refusal never evicts a change


# -- key/value ------------------------------------------------------------------------------------------


async def test_kv_put_if_absent_keeps_the_first_value(store: Store) -> None:
    assert await store.kv_put_if_absent("k", b"one") == b"one"
    assert await store.kv_put_if_absent("k", b"two") == b"one"
    firsts = await asyncio.gather(*[store.kv_put_if_absent("race", bytes([i])) for i in range(8)])
    assert len(set(firsts)) == 1 and store.kv_get("race") == firsts[0]
    await store.kv_delete("k")
    assert store.kv_get("k") is None
    await store.kv_put("k", b"\x00\xff")
    await store.kv_put("k", b"three")
    assert store.kv_get("k") == b"three"


async def test_kv_keys_by_prefix(store: Store) -> None:
    for k in ("cluster/a/x", "cluster/a/y", "cluster/ab/z", "other"):
        await store.kv_put(k, b"1")
    assert store.kv_keys("cluster/a/") == ["cluster/a/x", "cluster/a/y"]
    assert store.kv_keys("") == ["cluster/a/x", "cluster/a/y", "cluster/ab/z", "other"]


# -- replicas (alone, every backend behaves like this) ---------------------------------------------------


async def test_a_store_names_itself_and_holds_a_lease_alone(store: Store) -> None:
    assert len(store.replica_id) == 32 and store.kind in ("sqlite", "postgresql")
    lost: list[str] = []
    store.lease_lost(lost.append)
    store.subscribe(lambda change: None)
    assert await store.try_lease("singleton") and await store.try_lease("singleton")
    await store.release_lease("singleton")
    assert await store.try_lease("singleton")
    await store.release_lease("singleton")
    await store.publish("topic", "hello")  # nobody else listens
    assert lost == []
