"""Live state of connected agents and event followers (in memory, one controller process)."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from nodeagent.model import Event, Health


@dataclass(eq=False)
class Session:
    """One agent's open stream."""

    node: str
    environment: str
    outbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    connected_at: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    health: Health | None = None
    health_saved: float = 0.0
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    def send(self, msg: Any) -> None:
        self.outbox.put_nowait(msg)

    def close(self) -> None:
        self.closed.set()


class Hub:
    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._followers: dict[str, set[asyncio.Queue[Event]]] = defaultdict(set)

    # -- sessions -----------------------------------------------------------------------------

    def attach(self, node: str, environment: str) -> Session:
        """A new stream for ``node``; an older one (a half-dead connection) is closed."""
        old = self._sessions.get(node)
        if old is not None:
            old.close()
        session = Session(node, environment)
        self._sessions[node] = session
        return session

    def detach(self, session: Session) -> None:
        if self._sessions.get(session.node) is session:
            del self._sessions[session.node]

    def session(self, node: str) -> Session | None:
        return self._sessions.get(node)

    def connected(self, node: str) -> bool:
        return node in self._sessions

    def sessions(self, environment: str = "") -> list[Session]:
        return [s for s in self._sessions.values() if not environment or s.environment == environment]

    def send(self, node: str, msg: Any) -> bool:
        session = self._sessions.get(node)
        if session is None:
            return False
        session.send(msg)
        return True

    def __len__(self) -> int:
        return len(self._sessions)

    # -- followers ----------------------------------------------------------------------------

    def follow(self, keys: Iterable[str]) -> asyncio.Queue[Event]:
        q: asyncio.Queue[Event] = asyncio.Queue(maxsize=100_000)
        for k in keys:
            self._followers[k].add(q)
        return q

    def unfollow(self, q: asyncio.Queue[Event]) -> None:
        for key in list(self._followers):
            self._followers[key].discard(q)
            if not self._followers[key]:
                del self._followers[key]

    def publish(self, node: str, environment: str, events: Iterable[Event]) -> None:
        if not self._followers:
            return
        queues = self._followers.get(f"node:{node}", set()) | self._followers.get(f"env:{environment}", set())
        if not queues:
            return
        for e in events:
            for q in queues:
                if not q.full():
                    q.put_nowait(e)
