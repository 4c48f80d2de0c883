"""Which replica holds each node's stream: ``streams/<replica id>`` in the store's key/value table.

Each replica keeps one entry: the nodes whose streams it holds, each with when it attached
(compressed JSON). It is written at most every ``FLUSH_SECONDS`` while streams come and go, so
10,000 agents reconnecting at once cost a few writes a second, not one per agent. Other replicas
read an entry when the store says it changed and keep, per node, the newest claim. A claim counts
while its replica is live in the replica registry (``registry``: reported within
``LIVE_SECONDS``); a dead replica's streams are gone once it is stale, and its entry is removed
once it has been stale for ``PRUNE_SECONDS``. A replica whose local stream for a node is older than
another replica's claim is told (``supersede(node, claimed_ms)``): the agent may have moved, and
that stream be half dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import zlib
from collections.abc import Callable, Collection

from tether.controller.replicas.registry import PREFIX as REPLICA_PREFIX
from tether.controller.replicas.registry import Replica
from tether.controller.store import Store
from tether.nodeagent import logs
from tether.nodeagent.model import now_ms

log = logs.get_logger("tether.controller.replicas")

PREFIX = "streams/"
FLUSH_SECONDS = 0.25
SWEEP_SECONDS = 2.0
PRUNE_SECONDS = 60.0
RETRY_SECONDS = 1.0  # after a failed write (the store is down)


def encode(nodes: dict[str, int]) -> bytes:
    return zlib.compress(json.dumps(nodes, separators=(",", ":")).encode(), 1)


def decode(raw: bytes | None) -> dict[str, int]:
    if not raw:
        return {}
    try:
        doc = json.loads(zlib.decompress(raw))
        return {str(k): int(v) for k, v in doc.items()}
    except (ValueError, TypeError, AttributeError, zlib.error):
        return {}


class Liveness:
    """Whether a replica is live, from its registry entry (read at most once a second each)."""

    def __init__(self, store: Store, clock: Callable[[], int] = now_ms) -> None:
        self._store = store
        self._clock = clock
        self._known: dict[str, tuple[int, bool, int]] = {}  # id -> (read at, live, last seen)

    def __call__(self, replica: str) -> bool:
        return self._read(replica)[0]

    def stale_for_ms(self, replica: str) -> int:
        """How long ``replica`` has been stale (0 while live; long when it has no entry)."""
        live, seen = self._read(replica)
        return 0 if live else self._clock() - seen

    def _read(self, replica: str) -> tuple[bool, int]:
        now = self._clock()
        known = self._known.get(replica)
        if known is not None and now - known[0] < 1000:
            return known[1], known[2]
        raw = self._store.kv_get(REPLICA_PREFIX + replica)
        entry = Replica.from_bytes(replica, raw) if raw is not None else None
        live, seen = (entry.live(now), entry.last_seen_ms) if entry is not None else (False, 0)
        self._known[replica] = (now, live, seen)
        return live, seen


class StreamRegistry:
    """This replica's streams, published; the others', read. ``on_change(node)``: whether a node
    is connected may have changed; ``supersede(node, ms)``: another replica holds a stream of a
    node streaming here too, attached at ``ms``."""

    def __init__(
        self,
        store: Store,
        *,
        on_change: Callable[[str], None],
        supersede: Callable[[str, int], None],
        alive: Liveness | None = None,
        flush_s: float = FLUSH_SECONDS,
    ) -> None:
        self._store = store
        self.me = store.replica_id
        self._on_change = on_change
        self._supersede = supersede
        self.alive = alive or Liveness(store)
        self._flush_s = flush_s
        self.local: dict[str, int] = {}  # node -> when its stream here attached (ms)
        self._claims: dict[str, dict[str, int]] = {}  # other replica -> its nodes
        self._holders: dict[str, list[tuple[int, str]]] = {}  # node -> claims (ms, replica), newest first
        self._was_live: dict[str, bool] = {}
        self._raw: dict[str, bytes] = {}  # other replica -> its entry as last read
        self._flush: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._stopped = False
        self._failing = False

    @property
    def key(self) -> str:
        return PREFIX + self.me

    # -- this replica -------------------------------------------------------------------------

    def attached(self, node: str) -> None:
        self.local[node] = now_ms()
        self._dirty()

    def detached(self, node: str) -> None:
        self.local.pop(node, None)
        self._dirty()

    def _dirty(self, delay: float = 0.0) -> None:
        if self._flush is None and not self._stopped:
            wait = delay or self._flush_s
            self._flush = asyncio.get_running_loop().call_later(wait, self._spawn_flush)

    def _spawn_flush(self) -> None:
        task = asyncio.get_running_loop().create_task(self.flush())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def flush(self) -> None:
        """Write this replica's entry now (again later when the store refuses it)."""
        self._flush = None
        try:
            await self._store.kv_put(self.key, encode(dict(self.local)))
        except Exception as exc:
            if not self._failing:  # once per outage
                log.warning("stream registry not written; trying again", error=str(exc).splitlines()[:1])
            self._failing = True
            self._dirty(RETRY_SECONDS)
            return
        if self._failing:
            log.info("stream registry written again")
            self._failing = False

    # -- the others ---------------------------------------------------------------------------

    def holder(self, node: str) -> str | None:
        """The live replica (not this one) that holds ``node``'s stream, if any."""
        for _, replica in self._holders.get(node, ()):
            if self.alive(replica):
                return replica
        return None

    def changed(self, key: str) -> None:
        """The store says ``key`` (``streams/<id>``) changed on another replica."""
        replica = key.removeprefix(PREFIX)
        raw = self._store.kv_get(key)
        if replica == self.me:
            if raw is None:
                self._dirty()  # removed by a replica that took this one for dead: write it again
            return
        if raw != self._raw.get(replica):
            if raw is None:
                del self._raw[replica]
            else:
                self._raw[replica] = raw
            self._load(replica, decode(raw))

    def reread(self) -> None:
        """Every other replica's entry again, where it differs from the one last read (a change
        the store did not announce, e.g. while its connection was down, is not missed for long)."""
        keys = {k for k in self._store.kv_keys(PREFIX) if k != self.key}
        for replica in [r for r in self._raw if PREFIX + r not in keys]:
            self.changed(PREFIX + replica)
        for key in keys:
            self.changed(key)

    def _load(self, replica: str, nodes: dict[str, int]) -> None:
        before = self._claims.pop(replica, {})
        if nodes:
            self._claims[replica] = nodes
            if replica not in self._was_live:
                self._was_live[replica] = self.alive(replica)
        changed = [n for n in before.keys() | nodes.keys() if before.get(n) != nodes.get(n)]
        for node in changed:
            claims = sorted(((c[node], r) for r, c in self._claims.items() if node in c), reverse=True)
            if claims:
                self._holders[node] = claims
            else:
                self._holders.pop(node, None)
            since = nodes.get(node)
            if since is not None and node in self.local:
                self._supersede(node, since)
        for node in changed:
            self._on_change(node)

    def claimed(self) -> Collection[str]:
        """The nodes other replicas claim (live or not)."""
        return self._holders.keys()

    async def start(self) -> None:
        """Read every other replica's entry; write this one's; sweep for dead replicas."""
        self.reread()
        await self.flush()
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="stream-registry-sweep")

    async def stop(self) -> None:
        """Stop, and remove this replica's entry: its streams are gone at once for the others."""
        self._stopped = True
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        for task in [self._sweeper, *self._tasks]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._sweeper = None
        with contextlib.suppress(Exception):
            await self._store.kv_delete(self.key)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            try:
                await self.sweep()
            except Exception:
                log.exception("stream registry sweep failed")

    async def sweep(self) -> None:
        """A replica that went stale (or came back): its nodes' connection changed. One stale for
        ``PRUNE_SECONDS`` is forgotten and its entry removed."""
        self.reread()
        for replica in list(self._claims):
            live = self.alive(replica)
            if live != self._was_live.get(replica, True):
                self._was_live[replica] = live
                for node in list(self._claims.get(replica, {})):
                    self._on_change(node)
            if not live and self.alive.stale_for_ms(replica) > PRUNE_SECONDS * 1000:
                await self._store.kv_delete(PREFIX + replica)
                self.changed(PREFIX + replica)
                self._was_live.pop(replica, None)
