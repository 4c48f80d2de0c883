"""Replicas register themselves: ``replica/<id>`` in the store's key/value table.

Each replica writes its entry (advertise address, version, when it started, when it last reported,
whether it leads) at start and every ``REPORT_SECONDS``; an entry reported within ``LIVE_SECONDS``
is live. A clean stop removes the entry; one left by a replica that died stays, marked not live,
until the leader sweeps entries older than ``KEEP_STALE_SECONDS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from tether.nodeagent import logs
from tether.nodeagent.model import now_ms

log = logs.get_logger("tether.controller.replicas")

PREFIX = "replica/"
REPORT_SECONDS = 2.0
LIVE_SECONDS = 10.0
KEEP_STALE_SECONDS = 24 * 3600.0


class KvStore(Protocol):
    """The parts of ``tether.controller.store.Store`` the registry uses."""

    replica_id: str

    async def kv_put(self, key: str, value: bytes) -> None: ...
    def kv_get(self, key: str) -> bytes | None: ...
    def kv_keys(self, prefix: str) -> list[str]: ...
    async def kv_delete(self, key: str) -> None: ...


@dataclass(frozen=True)
class Replica:
    id: str
    address: str
    version: str
    started_ms: int
    last_seen_ms: int
    leader: bool = False

    def live(self, now: int) -> bool:
        return now - self.last_seen_ms <= LIVE_SECONDS * 1000

    def to_bytes(self) -> bytes:
        doc = {
            "address": self.address,
            "version": self.version,
            "started_ms": self.started_ms,
            "last_seen_ms": self.last_seen_ms,
            "leader": self.leader,
        }
        return json.dumps(doc, sort_keys=True).encode()

    @staticmethod
    def from_bytes(replica_id: str, raw: bytes) -> Replica | None:
        """The entry, or None when it does not parse (written by something else)."""
        try:
            doc = json.loads(raw)
            return Replica(
                id=replica_id,
                address=str(doc["address"]),
                version=str(doc.get("version", "")),
                started_ms=int(doc.get("started_ms", 0)),
                last_seen_ms=int(doc["last_seen_ms"]),
                leader=bool(doc.get("leader", False)),
            )
        except (ValueError, KeyError, TypeError):
            return None


class Registry:
    """This replica's entry, kept current; and every replica's, read from the store."""

    def __init__(
        self,
        store: KvStore,
        address: str,
        version: str,
        *,
        leading: Callable[[], bool] = lambda: False,
        clock: Callable[[], int] = now_ms,
        interval_s: float = REPORT_SECONDS,
    ) -> None:
        self._store = store
        self._leading = leading
        self._clock = clock
        self._interval_s = interval_s
        self.me = Replica(store.replica_id, address, version, started_ms=clock(), last_seen_ms=0)
        self._task: asyncio.Task[None] | None = None
        self._soon: set[asyncio.Task[None]] = set()

    @property
    def key(self) -> str:
        return PREFIX + self.me.id

    async def start(self) -> None:
        await self.report()
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="replica-registry")

    async def stop(self) -> None:
        """Stop reporting and remove this replica's entry (a clean stop)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self._store.kv_delete(self.key)
        except Exception as exc:  # the store is down: the entry goes stale and is swept later
            log.warning("replica entry not removed", error=(str(exc).splitlines() or [repr(exc)])[0])

    async def report(self) -> None:
        self.me = replace(self.me, last_seen_ms=self._clock(), leader=self._leading())
        await self._store.kv_put(self.key, self.me.to_bytes())

    def report_soon(self) -> None:
        """Report now, off the caller (the lease moved: ``controller list`` shows it at once)."""
        if self._task is not None:
            task = asyncio.ensure_future(self._report_quietly())
            self._soon.add(task)
            task.add_done_callback(self._soon.discard)

    async def _report_quietly(self) -> None:
        try:
            await self.report()
        except Exception as exc:  # the store is down: the loop tries again
            log.warning("replica report failed", error=(str(exc).splitlines() or [repr(exc)])[0])

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self._report_quietly()

    def replicas(self) -> list[Replica]:
        """Every registered replica, live ones first (this one as it is now, not as last stored)."""
        now = self._clock()
        found = {self.me.id: replace(self.me, last_seen_ms=now, leader=self._leading())}
        for key in self._store.kv_keys(PREFIX):
            rid = key.removeprefix(PREFIX)
            raw = self._store.kv_get(key)
            entry = Replica.from_bytes(rid, raw) if raw is not None and rid != self.me.id else None
            if entry is not None:
                found[rid] = entry
        return sorted(found.values(), key=lambda r: (not r.live(now), r.id != self.me.id, r.address, r.id))

    def live_addresses(self) -> list[str]:
        """The live replicas' addresses, this one's first (each once)."""
        now = self._clock()
        addresses: list[str] = []
        for r in self.replicas():
            if r.live(now) and r.address and r.address not in addresses:
                addresses.append(r.address)
        return addresses

    def live(self, replica: Replica) -> bool:
        return replica.live(self._clock())

    def leading(self, replica: Replica) -> bool:
        """Whether ``replica`` holds the singleton lease, as far as this replica knows: its own
        state for itself, the entry's word (live entries only) for another."""
        if replica.id == self.me.id:
            return self._leading()
        return replica.leader and replica.live(self._clock())

    async def sweep(self, older_than_s: float = KEEP_STALE_SECONDS) -> int:
        """Remove other replicas' entries not reported for ``older_than_s`` (the leader's work);
        how many."""
        cutoff = self._clock() - int(older_than_s * 1000)
        removed = 0
        for key in self._store.kv_keys(PREFIX):
            raw = self._store.kv_get(key)
            entry = Replica.from_bytes(key.removeprefix(PREFIX), raw) if raw is not None else None
            if key != self.key and (entry is None or entry.last_seen_ms <= cutoff):
                await self._store.kv_delete(key)
                removed += 1
        if removed:
            log.info("stale controller replicas forgotten", count=removed)
        return removed
