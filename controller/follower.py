"""One ``FollowEvents`` call's queue of live events, bounded in bytes.

A follower that reads more slowly than nodes write is cut off once its queue holds more than
``FOLLOWER_QUEUE_BYTES``: the queue is emptied at once (a stalled follower holds no memory) and
its next ``get`` raises ``FellBehind`` (RESOURCE_EXHAUSTED) saying where to follow again from.
"""

from __future__ import annotations

import asyncio
from collections import deque

import grpc

from tether.controller.errors import ControllerError
from tether.controller.limits import FOLLOWER_QUEUE_BYTES
from tether.controller.quotas import event_bytes as text_bytes
from tether.nodeagent.limits import size_text
from tether.nodeagent.model import Event

_EVENT_OVERHEAD = 256  # the event object, its fields and its place in the queue
_STRING_OVERHEAD = 56


class FellBehind(ControllerError):
    """The follower's queue went over its limit; it was cut off."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


def event_bytes(e: Event) -> int:
    """About how much memory ``e`` holds (what a queue that keeps it pins): its text, as the
    quotas count it, plus the objects around it."""
    objects = _EVENT_OVERHEAD + _STRING_OVERHEAD * (len(e.lines) + 2 * len(e.observed))
    return text_bytes(e) + len(e.node) + objects


class Follower:
    """``put`` never blocks; ``get`` waits for the next event, or raises once cut off."""

    def __init__(self, limit_bytes: int = FOLLOWER_QUEUE_BYTES) -> None:
        self.limit_bytes = limit_bytes
        self._events: deque[tuple[Event, int]] = deque()
        self._bytes = 0
        self._ready = asyncio.Event()
        self.cut_off: FellBehind | None = None

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._events)

    def put(self, e: Event) -> None:
        if self.cut_off is not None:
            return
        size = event_bytes(e)
        if self._bytes + size > self.limit_bytes:
            first = self._events[0][0] if self._events else e
            self._events.clear()
            self._bytes = 0
            self.cut_off = FellBehind(
                f"this follower fell behind by more than {self.limit_bytes} bytes "
                f"({size_text(self.limit_bytes)}) of events and was cut off; "
                f"follow again (node {first.node!r} from seq {first.seq})"
            )
        else:
            self._events.append((e, size))
            self._bytes += size
        self._ready.set()

    async def get(self) -> Event:
        while not self._events:
            if self.cut_off is not None:
                raise self.cut_off
            self._ready.clear()
            await self._ready.wait()
        e, size = self._events.popleft()
        self._bytes -= size
        return e
