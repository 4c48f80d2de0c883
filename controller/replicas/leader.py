"""One replica at a time runs the singleton work: the holder of the store's "singleton" lease.

Every replica tries to take the lease every ``TRY_SECONDS``. The one that holds it starts each
piece of singleton work (after ``settle_s``: changes the previous leader made just before it died
reach this replica's view first); when the lease is lost (``Store.lease_lost``: the connection
that held it is gone) the work stops at once, and another replica takes the lease within a few
seconds. Work resumes from the store, so nothing is done twice. With SQLite the lease is always
granted: the one replica leads from its start.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tether.nodeagent import logs

log = logs.get_logger("tether.controller.replicas")

LEASE = "singleton"
TRY_SECONDS = 2.0


class LeaseStore(Protocol):
    """The parts of ``tether.controller.store.Store`` the leader uses."""

    async def try_lease(self, name: str) -> bool: ...
    async def release_lease(self, name: str) -> None: ...
    def lease_lost(self, callback: Callable[[str], None]) -> None: ...


@dataclass(frozen=True)
class Work:
    """A piece of singleton work: started when this replica takes the lease, stopped when it
    loses it (both idempotent; ``start`` resumes from the store)."""

    name: str
    start: Callable[[], Awaitable[None]]
    stop: Callable[[], Awaitable[None]]


def every(name: str, seconds: float, fn: Callable[[], Awaitable[object]]) -> Work:
    """Work that runs ``fn`` at once and then every ``seconds`` while this replica leads."""
    task: asyncio.Task[None] | None = None

    async def loop() -> None:
        while True:
            try:
                await fn()
            except Exception:  # one failed round must not end the next ones
                log.exception("singleton work failed", work=name)
            await asyncio.sleep(seconds)

    async def start() -> None:
        nonlocal task
        if task is None:
            task = asyncio.create_task(loop(), name=name)

    async def stop() -> None:
        nonlocal task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            task = None

    return Work(name, start, stop)


class Leader:
    """Takes the singleton lease when it can and runs ``work`` while it holds it."""

    def __init__(
        self,
        store: LeaseStore,
        work: Sequence[Work] = (),
        *,
        interval_s: float = TRY_SECONDS,
        settle_s: float = 0.0,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self._store = store
        self.work = list(work)
        self._interval_s = interval_s
        self._settle_s = settle_s
        self.on_change = on_change  # called with True when this replica takes the lease, False when lost
        self._held = False
        self._term = 0  # one per take and per loss: a start that a loss overtook does not go on
        self._running: list[Work] = []
        self._lock = asyncio.Lock()  # starts and stops of the work, one after the other
        self._task: asyncio.Task[None] | None = None
        self._ending: set[asyncio.Task[None]] = set()

    @property
    def held(self) -> bool:
        return self._held

    async def start(self) -> None:
        """Try once now (SQLite: this replica leads before it serves), then every few seconds."""
        self._store.lease_lost(self._lost)
        await self._try_quietly()
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="leader")

    async def stop(self) -> None:
        """Stop trying, stop the work, and let the lease go (another replica takes it at once)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        was = self._held
        self._held = False
        self._term += 1
        await self._end()
        if was:
            with contextlib.suppress(Exception):
                await self._store.release_lease(LEASE)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            if not self._held:
                await self._try_quietly()

    async def _try_quietly(self) -> None:
        try:
            await self._try()
        except Exception as exc:  # the store is down: the loop tries again
            log.warning("singleton lease not taken", error=(str(exc).splitlines() or [repr(exc)])[0])

    async def _try(self) -> None:
        if not await self._store.try_lease(LEASE):
            return
        if self._held:
            return
        self._held = True
        self._term += 1
        term = self._term
        log.info("this replica leads: the singleton work runs here")
        self._changed(True)
        if self._settle_s:
            await asyncio.sleep(self._settle_s)
        await self._begin(term)

    async def _begin(self, term: int) -> None:
        async with self._lock:
            for w in self.work:
                if term != self._term:
                    return  # lost meanwhile: what started is being stopped
                try:
                    await w.start()
                except Exception:
                    log.exception("singleton work did not start", work=w.name)
                    continue
                self._running.append(w)

    def _lost(self, name: str) -> None:
        """The store lost the lease (called on the loop): stop the work now."""
        if name != LEASE or not self._held:
            return
        self._held = False
        self._term += 1
        log.warning("this replica lost the singleton lease: its singleton work stops")
        self._changed(False)
        task = asyncio.ensure_future(self._end())
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    async def _end(self) -> None:
        async with self._lock:
            while self._running:
                w = self._running.pop()
                try:
                    await w.stop()
                except Exception:
                    log.exception("singleton work did not stop cleanly", work=w.name)

    def _changed(self, held: bool) -> None:
        if self.on_change is not None:
            self.on_change(held)
