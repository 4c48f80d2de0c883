"""The agent's long-lived tasks, watched: the first one to fail stops the agent with one line.

A task that dies quietly leaves a node that heartbeats but never runs its plan again; an agent
that exits non-zero is restarted by systemd, and starts again from its journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import sqlite3
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from tether.nodeagent import logs
from tether.nodeagent.errors import AgentError, NodeReset, NodeRevoked, StateError, TaskFailed
from tether.nodeagent.secrets import PROCESS_REDACTOR
from tether.nodeagent.statedb import DB_NAME, corrupt_message, is_corrupt

log = logs.get_logger("tether.agent")

_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
# Errors of this host, not of the stream: reconnecting cannot help.
_LOCAL = _NO_SPACE | {errno.EROFS, errno.EIO}


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def no_space(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the disk is full."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in _NO_SPACE:
            return True
        if isinstance(e, sqlite3.Error) and (
            getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(e)
        ):
            return True
    return False


def local_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is this host's state failing (database, disk), which no reconnect mends."""
    return any(
        isinstance(e, (sqlite3.Error, StateError)) or (isinstance(e, OSError) and e.errno in _LOCAL)
        for e in _chain(exc)
    )


def failure_line(task: str, exc: BaseException, state_dir: Path) -> str:
    """One line saying why ``task`` failed (secrets masked)."""
    if no_space(exc):
        return f"no space left on device: {state_dir}"
    corrupt = next((e for e in _chain(exc) if is_corrupt(e)), None)
    if corrupt is not None:  # found while running: a page the open did not read
        return corrupt_message(state_dir / DB_NAME, " ".join(str(corrupt).split()))
    detail = " ".join(str(exc).split()) or "no detail"
    return PROCESS_REDACTOR.redact(f"{task} task failed: {type(exc).__name__}: {detail}")


class Supervisor:
    """Starts tasks and remembers the first failure; ``wait`` raises it."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._tasks: set[asyncio.Task[None]] = set()
        self._failure: AgentError | None = None
        self._failed = asyncio.Event()

    def watch(self, coro: Coroutine[Any, Any, None], name: str, *, forever: bool = True) -> None:
        """Run ``coro``; its failure (or, with ``forever``, its return) stops the agent."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._done(t, forever))

    def _done(self, task: asyncio.Task[None], forever: bool) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None and not forever:
            return
        if self._failure is not None:  # the first failure is the one that counts
            return
        if isinstance(exc, AgentError):
            self._failure = exc
        else:
            line = failure_line(task.get_name(), exc or RuntimeError("returned"), self.state_dir)
            failure = TaskFailed(line)
            failure.__cause__ = exc
            self._failure = failure
        if isinstance(exc, (NodeRevoked, NodeReset)):  # the agent's exit says it in one line
            log.info("the controller ended this node; the agent stops", task=task.get_name())
        else:
            log.error("agent task failed; exiting", task=task.get_name(), error=str(self._failure))
        self._failed.set()

    async def wait(self) -> None:
        """Until a watched task fails: then raise its AgentError, or TaskFailed with one line."""
        await self._failed.wait()
        assert self._failure is not None
        raise self._failure

    async def stop(self) -> None:
        """Cancel every task still running and wait for them."""
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
