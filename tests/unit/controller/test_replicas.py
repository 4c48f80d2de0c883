"""Issue 13: controller replicas register themselves, and one leads the singleton work."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tether.controller.replicas import leader as leader_mod
from tether.controller.replicas.leader import LEASE, Leader, Work, every
from tether.controller.replicas.registry import KEEP_STALE_SECONDS, LIVE_SECONDS, PREFIX, Registry, Replica


class FakeStore:
    """The key/value table and the lease of a store several replicas share (one in memory)."""

    def __init__(self, replica_id: str = "r1", shared: FakeStore | None = None) -> None:
        self.replica_id = replica_id
        self.kv: dict[str, bytes] = shared.kv if shared is not None else {}
        self.leases: dict[str, str] = shared.leases if shared is not None else {}
        self.lost: list[Callable[[str], None]] = []
        self.down = False  # its database connection is gone: no lease can be taken

    async def kv_put(self, key: str, value: bytes) -> None:
        self.kv[key] = value

    def kv_get(self, key: str) -> bytes | None:
        return self.kv.get(key)

    def kv_keys(self, prefix: str) -> list[str]:
        return sorted(k for k in self.kv if k.startswith(prefix))

    async def kv_delete(self, key: str) -> None:
        self.kv.pop(key, None)

    async def try_lease(self, name: str) -> bool:
        if self.down:
            raise ConnectionError("connection to the database lost")
        return self.leases.setdefault(name, self.replica_id) == self.replica_id

    async def release_lease(self, name: str) -> None:
        if self.leases.get(name) == self.replica_id:
            del self.leases[name]

    def lease_lost(self, callback: Callable[[str], None]) -> None:
        self.lost.append(callback)

    def lose(self, name: str) -> None:
        """This replica's connection holding ``name`` went away: the lease is free, callbacks run."""
        if self.leases.get(name) == self.replica_id:
            del self.leases[name]
            for cb in self.lost:
                cb(name)


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


# -- registry ---------------------------------------------------------------------------------


async def test_a_replica_registers_itself_and_reports_while_it_runs() -> None:
    store, clock = FakeStore("r1"), Clock()
    reg = Registry(store, "10.0.0.1:7443", "1.2.3", clock=clock, interval_s=0.01)
    await reg.start()
    entry = Replica.from_bytes("r1", store.kv[PREFIX + "r1"])
    assert entry is not None and entry.address == "10.0.0.1:7443" and entry.version == "1.2.3"
    assert entry.last_seen_ms == clock.now and entry.started_ms == clock.now
    clock.now += 5000
    await asyncio.sleep(0.05)  # it reports again by itself
    again = Replica.from_bytes("r1", store.kv[PREFIX + "r1"])
    assert again is not None and again.last_seen_ms == clock.now
    await reg.stop()
    assert PREFIX + "r1" not in store.kv  # a clean stop removes the entry


async def test_a_replica_not_seen_for_ten_seconds_is_not_live() -> None:
    clock = Clock()
    mine, theirs = FakeStore("r1"), None
    theirs = FakeStore("r2", shared=mine)
    r1 = Registry(mine, "a:1", "v", clock=clock)
    r2 = Registry(theirs, "b:2", "v", clock=clock)
    await r1.report()
    await r2.report()
    assert r1.live_addresses() == ["a:1", "b:2"]  # this replica first
    assert r2.live_addresses() == ["b:2", "a:1"]
    clock.now += int(LIVE_SECONDS * 1000) + 1  # r2 died: r1 reports, r2 does not
    await r1.report()
    assert r1.live_addresses() == ["a:1"]
    listed = r1.replicas()
    assert [(r.id, r.live(clock.now)) for r in listed] == [("r1", True), ("r2", False)]  # live first


async def test_the_leader_flag_of_a_dead_replica_does_not_count() -> None:
    clock = Clock()
    mine = FakeStore("r1")
    theirs = FakeStore("r2", shared=mine)
    r2 = Registry(theirs, "b:2", "v", leading=lambda: True, clock=clock)
    await r2.report()
    r1 = Registry(mine, "a:1", "v", clock=clock)
    (other,) = [r for r in r1.replicas() if r.id == "r2"]
    assert r1.leading(other)
    clock.now += int(LIVE_SECONDS * 1000) + 1
    (other,) = [r for r in r1.replicas() if r.id == "r2"]
    assert not r1.leading(other)


async def test_entries_older_than_a_day_are_swept() -> None:
    clock = Clock()
    store = FakeStore("r1")
    old = FakeStore("r2", shared=store)
    await Registry(old, "b:2", "v", clock=clock).report()
    reg = Registry(store, "a:1", "v", clock=clock)
    await reg.report()
    store.kv[PREFIX + "junk"] = b"not json"
    clock.now += int(KEEP_STALE_SECONDS * 1000) - 1
    await reg.report()
    assert await reg.sweep() == 1  # the unreadable one
    clock.now += 2
    assert await reg.sweep() == 1 and store.kv_keys(PREFIX) == [PREFIX + "r1"]  # never itself


# -- leader -----------------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.log: list[str] = []

    def work(self, name: str) -> Work:
        async def start() -> None:
            self.log.append(f"start {name}")

        async def stop() -> None:
            self.log.append(f"stop {name}")

        return Work(name, start, stop)


async def test_the_singleton_work_runs_on_the_lease_holder_only() -> None:
    one, rec_one = FakeStore("r1"), Recorder()
    two, rec_two = FakeStore("r2", shared=one), Recorder()
    first = Leader(one, [rec_one.work("rollouts"), rec_one.work("sweeps")], interval_s=0.01)
    second = Leader(two, [rec_two.work("rollouts")], interval_s=0.01)
    await first.start()
    await second.start()
    await asyncio.sleep(0.05)
    assert first.held and not second.held
    assert rec_one.log == ["start rollouts", "start sweeps"] and rec_two.log == []
    await first.stop()
    await second.stop()


async def test_a_lost_lease_stops_the_work_at_once_and_another_replica_takes_over() -> None:
    one, rec_one = FakeStore("r1"), Recorder()
    two, rec_two = FakeStore("r2", shared=one), Recorder()
    changes: list[bool] = []
    first = Leader(one, [rec_one.work("a"), rec_one.work("b")], interval_s=0.01, on_change=changes.append)
    second = Leader(two, [rec_two.work("a")], interval_s=0.01)
    await first.start()
    await second.start()
    one.down = True
    one.lose(LEASE)
    assert not first.held and changes == [True, False]
    await asyncio.sleep(0)  # the stop runs as soon as the loop turns
    await asyncio.sleep(0)
    assert rec_one.log == ["start a", "start b", "stop b", "stop a"]
    await asyncio.sleep(0.05)
    assert second.held and rec_two.log == ["start a"]
    await second.stop()
    assert rec_two.log == ["start a", "stop a"] and one.leases == {}  # let go on a clean stop
    one.down = False
    await asyncio.sleep(0.05)
    assert first.held  # the first one takes it back
    await first.stop()


async def test_a_loss_during_the_settle_time_starts_nothing() -> None:
    store, rec = FakeStore("r1"), Recorder()
    lead = Leader(store, [rec.work("a")], interval_s=10, settle_s=0.05)
    starting = asyncio.ensure_future(lead.start())
    await asyncio.sleep(0.01)
    store.lose(LEASE)
    await starting
    await asyncio.sleep(0.01)
    assert rec.log == [] and not lead.held
    await lead.stop()


async def test_periodic_work_runs_while_leading_and_survives_a_failed_round() -> None:
    calls: list[int] = []

    async def sweep() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the store blinked")

    work = every("sweep", 0.01, sweep)
    await work.start()
    for _ in range(100):
        await asyncio.sleep(0.01)
        if len(calls) >= 2:
            break
    await work.stop()
    done = len(calls)
    assert done >= 2
    await asyncio.sleep(0.03)
    assert len(calls) == done
    assert leader_mod.TRY_SECONDS <= 2.0
