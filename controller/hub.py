"""Live state of connected agents and event followers (in memory, one controller process)."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from tether.controller.follower import Follower
from tether.controller.limits import FOLLOWER_QUEUE_BYTES
from tether.controller.refusals import REFUSALS
from tether.nodeagent.model import Event, Health


@dataclass(eq=False)
class Session:
    """One agent's open stream."""

    node: str
    environment: str
    outbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    connected_at: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    health_saved: float = 0.0
    stored_seq: int = 0  # the node's events stored up to here (what was acknowledged on this stream)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    # The latest health report as it arrived, decoded only when someone reads ``health``:
    # heartbeats are the most frequent message, and most are never looked at.
    _report: Any = field(default=None, repr=False)
    _decode: Callable[[Any], Health] | None = field(default=None, repr=False)
    _health: Health | None = field(default=None, repr=False)

    @property
    def health(self) -> Health | None:
        if self._report is not None and self._decode is not None:
            self._health, self._report = self._decode(self._report), None
        return self._health

    @health.setter
    def health(self, value: Health | None) -> None:
        self._health, self._report = value, None

    def report_health(self, report: Any, decode: Callable[[Any], Health]) -> None:
        """Keep ``report`` (a wire message) as the latest health; ``decode`` turns it into ``Health``."""
        self._report, self._decode = report, decode

    def send(self, msg: Any) -> None:
        self.outbox.put_nowait(msg)

    def close(self) -> None:
        self.closed.set()


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
