"""The event outbox: every event gets the next per-node sequence number and stays on
disk until the controller acknowledges it, so each event reaches the controller
exactly once in effect (the controller stores by (node, seq) and ignores repeats).

Every event is made to fit one batch before it is numbered (``bounds.fit``), and a batch is
bounded in bytes as well as in events: nothing in the outbox is too large to leave the node.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

from tether.nodeagent import bounds, wire
from tether.nodeagent.limits import EVENT_BATCH_BYTES, EVENT_BATCH_COUNT
from tether.nodeagent.model import Event, now_ms
from tether.nodeagent.statedb import StateDB


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
        """Cut or split events to fit a batch, then number and persist them (in the caller's
        transaction, if any)."""
        if not events:
            return []
        fitted = [
            part for e in events for part in bounds.fit(e if e.time_ms else replace(e, time_ms=now_ms()))
        ]
        with self._db.transaction() as c:
            seq = self.next_seq
            stamped = []
            for e in fitted:
                stamped.append(replace(e, seq=seq))
                seq += 1
            c.executemany(
                "INSERT INTO outbox VALUES (?,?)",
                [(e.seq, json.dumps(e.to_json(), separators=(",", ":"))) for e in stamped],
            )
            c.execute("INSERT OR REPLACE INTO meta VALUES ('next_seq', ?)", (str(seq),))
        return stamped

    def pending(
        self,
        after_seq: int = 0,
        limit: int = EVENT_BATCH_COUNT,
        max_bytes: int = EVENT_BATCH_BYTES,
        up_to: int | None = None,
    ) -> list[Event]:
        """The next batch after ``after_seq``: at most ``limit`` events, ``max_bytes`` encoded,
        none past ``up_to`` (something else must go out right after it: a step's secrets).

        Never empty while events wait: the first always fits (``bounds.shrink`` cuts one that an
        older agent stored too large), so no event can wedge the outbox.
        """
        if up_to is not None:
            limit = max(0, min(limit, up_to - after_seq))
        rows = self._db.conn.execute(
            "SELECT body FROM outbox WHERE seq>? ORDER BY seq LIMIT ?", (after_seq, limit)
        )
        batch: list[Event] = []
        used = wire.BATCH_ENVELOPE_BYTES
        try:
            for (body,) in rows:  # read one at a time: a batch's worth, not ``limit`` rows
                e = bounds.shrink(Event.from_json(json.loads(body)), max_bytes - wire.BATCH_ENVELOPE_BYTES)
                used += wire.batch_cost(e)
                if batch and used > max_bytes:
                    break
                batch.append(e)
        finally:
            rows.close()
        return batch

    def count(self) -> int:
        return int(self._db.conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    def ack(self, seq: int) -> int:
        """The controller stored everything up to ``seq``: drop it. Returns how many were dropped.

        Not fsync'd: if the power takes this commit, the events are sent again and the
        controller, which stores by (node, seq), ignores them.
        """
        with self._db.transaction(durable=False) as c:
            dropped = c.execute("DELETE FROM outbox WHERE seq<=?", (seq,)).rowcount
            c.execute(_RAISE_ACKED, (str(seq),))
        return dropped


# acked_seq := seq, unless it is already higher (one statement: no read of it first).
_RAISE_ACKED = (
    "INSERT INTO meta VALUES ('acked_seq', ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value"
    " WHERE CAST(excluded.value AS INTEGER) > CAST(meta.value AS INTEGER)"
)
