"""Live state of connected agents and event followers (in memory, one controller process)."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from tether.controller.follower import Follower
from tether.controller.limits import FOLLOWER_QUEUE_BYTES
from tether.controller.refusals import REFUSALS
from tether.nodeagent.model import Event, Health


class Outbox:
    """One stream's messages to send, in order, for its one writer; closed with the stream.

    A list and, only while the writer waits, one future: an ``asyncio.Queue`` and an
    ``asyncio.Event`` per stream held five deques (3.8 KiB) for the life of every connection.
    ``is_set`` says whether it was closed (the spelling of the ``asyncio.Event`` it replaces:
    ``session.closed.is_set()``).
    """

    __slots__ = ("_closed", "_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False

    def put_nowait(self, msg: Any) -> None:
        self._items.append(msg)
        self._wake()

    def get_nowait(self) -> Any:
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.pop(0)

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)

    async def drain(self) -> list[Any]:
        """Every message queued, in order, once there is one; [] once closed (what is queued
        then never goes out)."""
        await self._wait()
        if self._closed:
            return []
        items, self._items = self._items, []
        return items

    async def get(self) -> Any:
        """The next message (the writer drains; this is for tests); QueueEmpty once closed."""
        await self._wait()
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.pop(0)

    async def _wait(self) -> None:
        while not self._items and not self._closed:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    def close(self) -> None:
        self._closed = True
        self._wake()

    def is_set(self) -> bool:
        return self._closed

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Session:
    """One agent's open stream (slots: one of these lives per connected agent)."""

    __slots__ = (
        "_decode",
        "_health",
        "_report",
        "connected_at",
        "environment",
        "health_saved",
        "last_seen",
        "node",
        "on_close",
        "outbox",
        "stored_seq",
    )

    def __init__(self, node: str, environment: str) -> None:
        self.node = node
        self.environment = environment
        self.outbox = Outbox()
        self.connected_at = self.last_seen = time.monotonic()
        self.health_saved = 0.0  # when its health was last handed to the store (0: not on this stream)
        self.stored_seq = 0  # the node's events stored up to here (what was acknowledged on this stream)
        self.on_close: Callable[[], None] | None = None  # the stream's own way to stop reading
        # The latest health report as it arrived, decoded only when someone reads ``health``:
        # heartbeats are the most frequent message, and most are never looked at.
        self._report: Any = None
        self._decode: Callable[[Any], Health] | None = None
        self._health: Health | None = None

    def __repr__(self) -> str:
        return f"Session(node={self.node!r}, environment={self.environment!r}, closed={self.outbox.is_set()})"

    @property
    def closed(self) -> Outbox:
        """``closed.is_set()``: the stream was closed (revoked, replaced, reset)."""
        return self.outbox

    @property
    def health(self) -> Health | None:
        if self._report is not None and self._decode is not None:
            self._health, self._report = self._decode(self._report), None
        return self._health

    @health.setter
    def health(self, value: Health | None) -> None:
        self._health, self._report = value, None

    def report_health(self, report: Any, decode: Callable[[Any], Health]) -> None:
        """Keep ``report`` as the latest health; ``decode`` turns it into ``Health``. Keep it small:
        one is held per connected agent (the stream's reader passes the message's bytes, not the
        parsed message, which holds its whole arena of about 1 KiB); the report it supersedes,
        decoded once read (another KiB), is dropped."""
        self._report, self._decode, self._health = report, decode, None

    def send(self, msg: Any) -> None:
        self.outbox.put_nowait(msg)

    def close(self) -> None:
        if self.outbox.is_set():
            return
        self.outbox.close()
        if self.on_close is not None:
            self.on_close()


class Remote(Protocol):
    """The streams other controller replicas hold (``tether.controller.replicas.delivery``)."""

    def attached(self, session: Session) -> None: ...

    def detached(self, session: Session) -> None: ...

    def connected(self, node: str) -> bool: ...

    def send(self, node: str, msg: Any) -> bool: ...


class Hub:
    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._followers: dict[str, set[Follower]] = defaultdict(set)
        self.on_change: Callable[[str], None] = lambda node: None  # a stream came or went (nodewatch)
        self.remote: Remote | None = None  # several replicas: streams held by the others

    # -- sessions -----------------------------------------------------------------------------

    def attach(self, node: str, environment: str) -> Session:
        """A new stream for ``node``; an older one (a half-dead connection) is closed."""
        old = self._sessions.get(node)
        if old is not None:
            old.close()
        session = Session(node, environment)
        self._sessions[node] = session
        if self.remote is not None:
            self.remote.attached(session)
        self.on_change(node)
        return session

    def detach(self, session: Session) -> None:
        if self._sessions.get(session.node) is session:
            del self._sessions[session.node]
            if self.remote is not None:
                self.remote.detached(session)
            self.on_change(session.node)

    def session(self, node: str) -> Session | None:
        return self._sessions.get(node)

    def connected(self, node: str) -> bool:
        """Its stream is open here or, with several replicas, on a live other one."""
        return node in self._sessions or (self.remote is not None and self.remote.connected(node))

    def sessions(self, environment: str = "") -> list[Session]:
        return [s for s in self._sessions.values() if not environment or s.environment == environment]

    def send(self, node: str, msg: Any) -> bool:
        session = self._sessions.get(node)
        if session is None:  # with several replicas: to the one that holds its stream, if any
            return self.remote.send(node, msg) if self.remote is not None else False
        session.send(msg)
        return True

    def __len__(self) -> int:
        return len(self._sessions)

    # -- followers ----------------------------------------------------------------------------

    def follow(self, keys: Iterable[str], limit_bytes: int = FOLLOWER_QUEUE_BYTES) -> Follower:
        """A queue of the live events of ``keys`` (``node:NAME``, ``env:NAME``), bounded in bytes."""
        follower = Follower(limit_bytes)
        for k in keys:
            self._followers[k].add(follower)
        return follower

    def unfollow(self, follower: Follower) -> None:
        for key in list(self._followers):
            self._followers[key].discard(follower)
            if not self._followers[key]:
                del self._followers[key]

    def following(self, node: str, environment: str) -> bool:
        """Someone follows the events of ``node`` (or of its environment)."""
        followers = self._followers
        return bool(followers) and (f"node:{node}" in followers or f"env:{environment}" in followers)

    def publish(self, node: str, environment: str, events: Iterable[Event]) -> None:
        if not self._followers:
            return
        followers = self._followers.get(f"node:{node}", set()) | self._followers.get(
            f"env:{environment}", set()
        )
        if not followers:
            return
        for e in events:
            for f in followers:
                f.put(e)
        for f in followers:
            if f.cut_off is not None:
                self.unfollow(f)  # it gets nothing more; its call ends with the reason
                REFUSALS.refused(
                    "follower cut off", node=node, environment=environment, reason=str(f.cut_off)
                )
