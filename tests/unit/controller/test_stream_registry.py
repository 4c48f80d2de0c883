"""The shared stream registry (``tether.controller.replicas.streams``) on a key/value table."""

from __future__ import annotations

from tether.controller.replicas.streams import PRUNE_SECONDS, StreamRegistry, decode, encode
from tether.nodeagent.model import now_ms


class Kv:
    replica_id = "me"

    def __init__(self) -> None:
        self.kv: dict[str, bytes] = {}
        self.puts = 0

    async def kv_put(self, key: str, value: bytes) -> None:
        self.puts += 1
        self.kv[key] = value

    def kv_get(self, key: str) -> bytes | None:
        return self.kv.get(key)

    def kv_keys(self, prefix: str) -> list[str]:
        return sorted(k for k in self.kv if k.startswith(prefix))

    async def kv_delete(self, key: str) -> None:
        self.kv.pop(key, None)


class Alive:
    def __init__(self) -> None:
        self.dead: dict[str, int] = {}  # replica -> stale for (ms)

    def __call__(self, replica: str) -> bool:
        return replica not in self.dead

    def stale_for_ms(self, replica: str) -> int:
        return self.dead.get(replica, 0)


def registry(kv: Kv, alive: Alive, changes: list[str], superseded: list[str] | None = None) -> StreamRegistry:
    return StreamRegistry(
        kv,  # type: ignore[arg-type]
        on_change=changes.append,
        supersede=lambda node, ms: (superseded if superseded is not None else []).append(node),
        alive=alive,  # type: ignore[arg-type]
        flush_s=0.01,
    )


async def test_attaches_are_written_together_and_read_by_the_others() -> None:
    kv, alive, changes = Kv(), Alive(), []
    reg = registry(kv, alive, changes)
    await reg.start()
    for i in range(100):
        reg.attached(f"n{i}")
    reg.detached("n0")
    await reg.flush()
    assert kv.puts == 2 and sorted(decode(kv.kv["streams/me"])) == sorted(f"n{i}" for i in range(1, 100))
    kv.kv["streams/other"] = encode({"x1": now_ms(), "x2": now_ms()})
    reg.changed("streams/other")
    assert reg.holder("x1") == "other" and reg.holder("n1") is None and sorted(changes) == ["x1", "x2"]
    await reg.stop()
    assert "streams/me" not in kv.kv  # gone at once for the others


async def test_a_missed_change_is_read_at_the_next_sweep_and_a_long_dead_entry_is_removed() -> None:
    kv, alive, changes = Kv(), Alive(), []
    reg = registry(kv, alive, changes)
    await reg.start()
    kv.kv["streams/other"] = encode({"x1": now_ms()})  # never announced
    await reg.sweep()
    assert reg.holder("x1") == "other"
    alive.dead["other"] = 5_000
    assert reg.holder("x1") is None  # stale: its streams are gone
    changes.clear()
    await reg.sweep()
    assert changes == ["x1"]  # its node's state changed (offline)
    alive.dead["other"] = int(PRUNE_SECONDS * 1000) + 1
    await reg.sweep()
    assert "streams/other" not in kv.kv and not reg.claimed()
    await reg.stop()


async def test_the_newest_live_claim_wins_and_a_moved_agent_is_reported() -> None:
    kv, alive, changes, superseded = Kv(), Alive(), [], []
    reg = registry(kv, alive, changes, superseded)
    await reg.start()
    reg.attached("n1")
    kv.kv["streams/old"] = encode({"n1": now_ms() - 10_000})
    kv.kv["streams/new"] = encode({"n1": now_ms() + 10_000})
    reg.changed("streams/old")
    reg.changed("streams/new")
    assert reg.holder("n1") == "new" and superseded == ["n1", "n1"]
    alive.dead["new"] = 1
    assert reg.holder("n1") == "old"
    await reg.stop()
