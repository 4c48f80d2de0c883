"""The step journal: pending -> running -> succeeded / failed, keyed by step digest.

``running`` is committed before a step starts, so after a crash the agent
knows which step was interrupted and runs it again. A step counts as done only
while the *last* run of that step (by name) had this digest and succeeded:
recording a step under a new digest supersedes (deletes) its entries under
older ones, so going A -> B -> A runs the step again. Secret inputs are never
journaled.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from tether.nodeagent.model import now_ms
from tether.nodeagent.statedb import StateDB


class JournalState(str, enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REBOOTING = "rebooting"  # succeeded, and the reboot that follows it is under way


@dataclass(frozen=True)
class JournalEntry:
    digest: str
    step: str
    state: JournalState
    attempt: int
    exit_code: int
    updated_ms: int
    boot_id: str
    plan_digest: str


class Journal:
    def __init__(self, db: StateDB) -> None:
        self._db = db

    def get(self, digest: str) -> JournalEntry | None:
        """The entry for ``digest``, unless a later run of the same step superseded it."""
        row = self._db.conn.execute(
            f"SELECT {_COLUMNS} FROM journal j WHERE digest=? AND {_CURRENT}", (digest,)
        ).fetchone()
        return _entry(row) if row else None

    def record(
        self,
        digest: str,
        step: str,
        state: JournalState,
        *,
        attempt: int = 0,
        exit_code: int = 0,
        boot_id: str = "",
        plan_digest: str = "",
    ) -> None:
        with self._db.transaction() as c:
            # The last run of a step is the one that counts: older digests of it no longer do.
            c.execute("DELETE FROM journal WHERE step=? AND digest<>?", (step, digest))
            c.execute(
                f"INSERT OR REPLACE INTO journal ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)",
                (digest, step, state.value, attempt, exit_code, now_ms(), boot_id, plan_digest),
            )

    def seen_in_plan(self, digest: str, plan_digest: str) -> None:
        with self._db.transaction() as c:
            c.execute("UPDATE journal SET plan_digest=? WHERE digest=?", (plan_digest, digest))

    def forget(self, digests: list[str] | None = None) -> int:
        """Drop entries so their steps run again (all entries when ``digests`` is None)."""
        with self._db.transaction() as c:
            if digests is None:
                return c.execute("DELETE FROM journal").rowcount
            return sum(c.execute("DELETE FROM journal WHERE digest=?", (d,)).rowcount for d in digests)

    def entries(self) -> list[JournalEntry]:
        """The current entry of every step (what ``status`` and the controller's Hello see)."""
        rows = self._db.conn.execute(
            f"SELECT {_COLUMNS} FROM journal j WHERE {_CURRENT} ORDER BY updated_ms"
        ).fetchall()
        return [_entry(r) for r in rows]


_COLUMNS = "digest, step, state, attempt, exit_code, updated_ms, boot_id, plan_digest"
# A journal written before entries were superseded may hold several digests of one step: only the
# most recently recorded one (INSERT OR REPLACE gives it the highest rowid) counts.
_CURRENT = "NOT EXISTS (SELECT 1 FROM journal o WHERE o.step = j.step AND o.rowid > j.rowid)"


def _entry(row: Any) -> JournalEntry:
    digest, step, state, attempt, exit_code, updated, boot_id, plan_digest = row
    return JournalEntry(
        str(digest),
        str(step),
        JournalState(str(state)),
        int(attempt),
        int(exit_code),
        int(updated),
        str(boot_id),
        str(plan_digest),
    )
