"""WatchNodes' revision log: every change of a node's state, numbered, kept in a bounded ring.

One place sees every change. ``WatchedStore`` wraps the store the servicers write through (enroll,
revoke, a plan, step events, a rerun, a delete) and the hub reports a stream coming up or going
(``Hub.on_change``). After each, ``NodeWatch.check`` works out the node's state
(``nodestate.node_state``), compares it with the last one it knew and appends a ``Change`` only
when they differ: a new node is ``added`` (reason ``enrolled``), a forgotten one ``deleted``, any
other change ``modified`` with the new state as its reason.

Revisions are ``epoch << 40 | n``: the epoch is counted up in the store's kv at every start, so
revisions only grow, across restarts too. The ring lives in memory only (the last
``MAX_WATCH_HISTORY`` changes): a revision of an earlier run, or one older than the ring, is
``OUT_OF_RANGE`` (list again) rather than a wrong replay. Each ``WatchNodes`` call reads changes
from a queue of at most ``WATCH_QUEUE_CHANGES``; a watcher that falls that far behind is cut off
with ``RESOURCE_EXHAUSTED`` naming the revision to watch again from.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tether.controller import wire
from tether.controller.errors import OutOfRange, ResourceExhausted
from tether.controller.nodestate import node_state
from tether.controller.refusals import REFUSALS
from tether.controller.store.base import Store
from tether.controller.store.records import NodeRecord
from tether.controller.tokens import TokenRecord
from tether.nodeagent import logs
from tether.nodeagent.model import Event, EventKind, Plan

if TYPE_CHECKING:
    from tether.controller.hub import Hub

log = logs.get_logger("tether.controller.nodewatch")
MAX_WATCH_HISTORY = 100_000  # node state changes kept to resume a watch from
WATCH_QUEUE_CHANGES = 10_000  # changes queued for one WatchNodes call; over it, it is cut off
EPOCH_KEY = "nodewatch/epoch"
EPOCH_SHIFT = 40  # revisions of one run: epoch << 40, + 1 per change

ADDED, MODIFIED, DELETED = "added", "modified", "deleted"
ENROLLED, GONE = "enrolled", "deleted"  # the reasons of an added and a deleted change
_STATE_FIELDS = frozenset({"revoked", "plan_digest", "plan_generation", "hardware"})  # update_node fields
_STEP_KINDS = frozenset(
    {EventKind.STARTED, EventKind.WAITING, EventKind.SUCCEEDED, EventKind.FAILED, EventKind.SKIPPED}
)
_TYPES = {
    ADDED: wire.admin.NODE_EVENT_TYPE_ADDED,
    MODIFIED: wire.admin.NODE_EVENT_TYPE_MODIFIED,
    DELETED: wire.admin.NODE_EVENT_TYPE_DELETED,
}


@dataclass(frozen=True, slots=True)
class Change:
    """One change of a node's state; ``record``: a deleted node's last record (without facts)."""

    revision: int
    kind: str  # added | modified | deleted
    reason: str  # enrolled | provisioning | provisioned | failed | offline | revoked | deleted
    node: str
    environment: str
    state: str  # the node's state after the change (a deleted node: its last one)
    record: NodeRecord | None = None


@dataclass(frozen=True, slots=True)
class _Known:
    state: str
    environment: str
    enrolled_ms: int


def environment_filter(environment: str, allowed: Collection[str] = ()) -> Callable[[str], bool]:
    """Whether a change of a node in an environment goes to a watcher: the one it asked for ("" =
    any) and, for a scoped caller, one of its ``allowed`` environments (empty = all)."""
    scope = frozenset(allowed)
    return lambda env: (not environment or env == environment) and (not scope or env in scope)


class Watcher:
    """One WatchNodes call's queue: ``put`` never blocks; ``get`` waits, or raises once cut off."""

    def __init__(self, accept: Callable[[str], bool], start: int, limit: int = WATCH_QUEUE_CHANGES) -> None:
        self.accept = accept
        self.start = start  # the revision the call started from (what SYNCED carries)
        self.last = start  # the last revision handed out
        self.limit = limit
        self.cut_off: ResourceExhausted | None = None
        self._changes: deque[Change] = deque()
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._changes)

    def put(self, change: Change) -> None:
        if self.cut_off is not None or not self.accept(change.environment):
            return
        if len(self._changes) >= self.limit:
            self._changes.clear()  # a stalled watcher holds no memory
            self.cut_off = ResourceExhausted(
                f"this watch fell behind by more than {self.limit} changes and was cut off; "
                f"watch again from revision {self.last}"
            )
        else:
            self._changes.append(change)
        self._ready.set()

    async def get(self) -> Change:
        while not self._changes:
            if self.cut_off is not None:
                raise self.cut_off
            self._ready.clear()
            await self._ready.wait()
        change = self._changes.popleft()
        self.last = change.revision
        return change


class NodeWatch:
    """The revision log of node state changes and its watchers (one controller process)."""

    def __init__(
        self,
        store: Store,
        hub: Hub | None = None,
        *,
        history: int = MAX_WATCH_HISTORY,
        queue: int = WATCH_QUEUE_CHANGES,
    ) -> None:
        self._raw = store
        self.store = WatchedStore(store, self)  # what the servicers write through
        self._connected: Callable[[str], bool] = hub.connected if hub is not None else (lambda name: False)
        if hub is not None:
            hub.on_change = self.check
        self._ring: deque[Change] = deque(maxlen=history)
        self._queue = queue
        self.revision = 0  # the latest change's
        self.floor = 0  # the oldest revision a watch can resume from
        self._known: dict[str, _Known] | None = None
        self._watchers: set[Watcher] = set()

    async def start(self) -> None:
        """Count the epoch up in the store: revisions of an earlier run are out of range from now."""
        stored = self._raw.kv_get(EPOCH_KEY)
        epoch = int(stored) + 1 if stored else 1
        await self._raw.kv_put(EPOCH_KEY, str(epoch).encode())
        self.revision = self.floor = max(self.revision, epoch << EPOCH_SHIFT)
        self._states()

    # -- changes ------------------------------------------------------------------------------

    def check(self, name: str) -> None:
        """Compare ``name``'s state now with the last one known; record a change if it differs.
        Never raises: a write that succeeded, or an agent's stream, never fails because of it."""
        try:
            self._check(name)
        except Exception:
            log.exception("node watch: cannot work out a node's state", node=name)

    def _check(self, name: str) -> None:
        known = self._states()
        record = self._raw.get_node(name)
        before = known.get(name)
        if record is None:
            return  # forgotten: ``deleted`` records that, with the record it had
        state = self._state(record)
        if before is not None and before.environment != record.environment:
            self.deleted(replace(record, environment=before.environment), before.state)
            before = None
        if before is None or before.enrolled_ms != record.enrolled_ms:
            self._append(ADDED, ENROLLED, record.name, record.environment, state)
        elif before.state != state:
            self._append(MODIFIED, state, record.name, record.environment, state)
        known[name] = _Known(state, record.environment, record.enrolled_ms)

    def state(self, name: str) -> str:
        """The node's state as last worked out ("" for a node it does not know)."""
        known = self._states().get(name)
        return known.state if known is not None else ""

    def deleted(self, record: NodeRecord, state: str = "") -> None:
        """``record``'s node is gone from the store (deleted, or reset and forgotten)."""
        before = self._states().pop(record.name, None)
        if before is None and not state:
            return
        last = state or (before.state if before else "")
        snapshot = replace(record, facts={}, health={})
        self._append(DELETED, GONE, record.name, record.environment, last, snapshot)

    def forgotten(self, name: str) -> None:
        """Another replica deleted ``name`` (its record is gone already): ``deleted`` with what
        this one last knew of it."""
        before = self._states().get(name)
        if before is not None:
            record = NodeRecord(name, before.environment, "", "", "", "", before.enrolled_ms)
            self.deleted(record, before.state)

    def _append(
        self,
        kind: str,
        reason: str,
        name: str,
        environment: str,
        state: str,
        record: NodeRecord | None = None,
    ) -> None:
        self.revision += 1
        if self._ring.maxlen is not None and len(self._ring) == self._ring.maxlen:
            self.floor = self._ring[0].revision  # it leaves the ring: resuming needs what follows it
        change = Change(self.revision, kind, reason, name, environment, state, record)
        self._ring.append(change)
        for w in list(self._watchers):
            w.put(change)
            if w.cut_off is not None:
                self._watchers.discard(w)  # it gets nothing more; its call ends with the reason
                REFUSALS.refused("node watcher cut off", reason=str(w.cut_off))

    def _state(self, record: NodeRecord) -> str:
        connected = self._connected(record.name)
        busy = connected and record.plan_digest and not record.revoked
        return node_state(record, self._raw.node_steps(record.name) if busy else (), connected).value

    def _states(self) -> dict[str, _Known]:
        """The last state known of every node (read from the store on first use)."""
        if self._known is None:
            self._known = {
                n.name: _Known(self._state(n), n.environment, n.enrolled_ms) for n in self._raw.list_nodes()
            }
        return self._known

    # -- watchers -----------------------------------------------------------------------------

    def subscribe(self, accept: Callable[[str], bool], after: int = 0) -> tuple[Watcher, list[Change]]:
        """A watcher of the changes from now on, and the kept ones after ``after`` (0: none)."""
        self._states()
        backlog: list[Change] = []
        if after:
            if after < self.floor:
                raise OutOfRange(f"revision {after} is no longer kept (oldest {self.floor}); list again")
            if after > self.revision:
                raise OutOfRange(
                    f"revision {after} is newer than this controller's ({self.revision}); list again"
                )
            backlog = [c for c in self._ring if c.revision > after and accept(c.environment)]
        watcher = Watcher(accept, after or self.revision, self._queue)
        self._watchers.add(watcher)
        return watcher, backlog

    def unsubscribe(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)

    def __len__(self) -> int:
        return len(self._ring)

    async def events(
        self,
        environment: str,
        after: int,
        allowed: Collection[str],
        node_pb: Callable[[NodeRecord], wire.admin.Node],
    ) -> AsyncIterator[wire.admin.NodeEvent]:
        """WatchNodes: the list (``after`` 0) or the kept changes after ``after``, then live ones;
        of ``environment`` ("" = any) and, for a scoped caller, of its ``allowed`` environments."""
        accept = environment_filter(environment, allowed)
        watcher, backlog = self.subscribe(accept, after)
        try:
            if not after:
                for record in self._raw.list_nodes(environment):
                    if accept(record.environment):
                        yield wire.admin.NodeEvent(
                            type=wire.admin.NODE_EVENT_TYPE_ADDED,
                            node=node_pb(record),
                            revision=watcher.start,
                        )
                yield wire.admin.NodeEvent(type=wire.admin.NODE_EVENT_TYPE_SYNCED, revision=watcher.start)
            for change in backlog:
                yield self._event_pb(change, node_pb)
            while True:
                yield self._event_pb(await watcher.get(), node_pb)  # raises once cut off
        finally:
            self.unsubscribe(watcher)

    def _event_pb(
        self, change: Change, node_pb: Callable[[NodeRecord], wire.admin.Node]
    ) -> wire.admin.NodeEvent:
        """The change with its node as it is now (gone: its last record, or its name at least)."""
        record = None if change.kind == DELETED else self._raw.get_node(change.node)
        if record is not None and record.environment == change.environment:
            node = node_pb(record)
        elif change.record is not None:
            node = wire.node_to_pb(change.record, change.state, False)
        else:
            node = wire.admin.Node(name=change.node, environment=change.environment, state=change.state)
        return wire.admin.NodeEvent(
            type=_TYPES[change.kind], node=node, revision=change.revision, reason=change.reason
        )


class WatchedStore:
    """The store, with every write that can change a node's state reported to the watch."""

    def __init__(self, inner: Store, watch: NodeWatch) -> None:
        self._inner = inner
        self._watch = watch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def enroll_node(
        self,
        token_id: str,
        node_name: str,
        decide: Callable[[TokenRecord | None, NodeRecord | None], tuple[NodeRecord, bool]],
    ) -> NodeRecord:
        record = await self._inner.enroll_node(token_id, node_name, decide)
        self._watch.check(node_name)
        return record

    async def update_node(self, name: str, **fields: Any) -> None:
        await self._inner.update_node(name, **fields)
        if _STATE_FIELDS.intersection(fields):
            self._watch.check(name)

    async def patch_node_hardware(self, name: str, changes: Mapping[str, Any]) -> None:
        await self._inner.patch_node_hardware(name, changes)
        if "quarantine" in changes:
            self._watch.check(name)

    async def set_node_plan(self, name: str, plan: Plan) -> None:
        await self._inner.set_node_plan(name, plan)
        self._watch.check(name)

    async def reset_steps(self, name: str, steps: Sequence[str]) -> None:
        await self._inner.reset_steps(name, steps)
        self._watch.check(name)

    async def append_events(self, node: str, events: Sequence[Event]) -> int:
        stored = await self._inner.append_events(node, events)
        if any(e.step and e.kind in _STEP_KINDS for e in events):
            self._watch.check(node)
        return stored

    async def delete_node(self, name: str) -> bool:
        record = self._inner.get_node(name)
        gone = await self._inner.delete_node(name)
        if gone and record is not None:
            self._watch.deleted(record)
        return gone


__all__ = ["MAX_WATCH_HISTORY", "WATCH_QUEUE_CHANGES", "Change", "NodeWatch", "WatchedStore", "Watcher"]
