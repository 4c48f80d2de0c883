"""The event outbox: every event gets the next per-node sequence number and stays on
disk until the controller acknowledges it, so each event reaches the controller
exactly once in effect (the controller stores by (node, seq) and ignores repeats).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

from nodeagent.model import Event, now_ms
from nodeagent.statedb import StateDB


class Outbox:
    def __init__(self, db: StateDB) -> None:
        self._db = db

    @property
    def next_seq(self) -> int:
        return int(self._db.get_meta("next_seq", "1"))

    @property
    def acked_seq(self) -> int:
        return int(self._db.get_meta("acked_seq", "0"))

    def start_at(self, seq: int) -> None:
        """Never hand out a number below ``seq`` (the controller's next number for this node)."""
        with self._db.transaction() as c:
            if seq > self.next_seq:
                c.execute("INSERT OR REPLACE INTO meta VALUES ('next_seq', ?)", (str(seq),))
            if seq - 1 > self.acked_seq:
                c.execute("INSERT OR REPLACE INTO meta VALUES ('acked_seq', ?)", (str(seq - 1),))

    def append(self, events: Sequence[Event]) -> list[Event]:
        """Number and persist events (in the caller's transaction, if any)."""
        if not events:
            return []
        with self._db.transaction() as c:
            seq = self.next_seq
            stamped = []
            for e in events:
                e = replace(e, seq=seq, time_ms=e.time_ms or now_ms())
                stamped.append(e)
                seq += 1
            c.executemany(
                "INSERT INTO outbox VALUES (?,?)",
                [(e.seq, json.dumps(e.to_json(), separators=(",", ":"))) for e in stamped],
            )
            c.execute("INSERT OR REPLACE INTO meta VALUES ('next_seq', ?)", (str(seq),))
        return stamped

    def pending(self, after_seq: int = 0, limit: int = 500) -> list[Event]:
        rows = self._db.conn.execute(
            "SELECT body FROM outbox WHERE seq>? ORDER BY seq LIMIT ?", (after_seq, limit)
        ).fetchall()
        return [Event.from_json(json.loads(r[0])) for r in rows]

    def count(self) -> int:
        return int(self._db.conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    def ack(self, seq: int) -> int:
        """The controller stored everything up to ``seq``: drop it. Returns how many were dropped.

        Not fsync'd: if the power takes this commit, the events are sent again and the
        controller, which stores by (node, seq), ignores them.
        """
        with self._db.transaction(durable=False) as c:
            dropped = c.execute("DELETE FROM outbox WHERE seq<=?", (seq,)).rowcount
            if seq > self.acked_seq:
                c.execute("INSERT OR REPLACE INTO meta VALUES ('acked_seq', ?)", (str(seq),))
        return dropped
