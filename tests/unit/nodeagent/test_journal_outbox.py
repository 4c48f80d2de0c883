"""The agent's durable journal and outbox (one SQLite file)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tether.nodeagent.journal import Journal, JournalState
from tether.nodeagent.model import Event, EventKind
from tether.nodeagent.outbox import Outbox
from tether.nodeagent.statedb import StateDB


def open_db(tmp_path: Path) -> StateDB:
    return StateDB(tmp_path / "state.db")


def test_journal_survives_reopen(tmp_path: Path) -> None:
    db = open_db(tmp_path)
    Journal(db).record("d1", "step-a", JournalState.RUNNING, attempt=1, boot_id="b1", plan_digest="p")
    Journal(db).record("d2", "step-b", JournalState.SUCCEEDED, attempt=2, exit_code=0)
    db.close()
    journal = Journal(open_db(tmp_path))
    a, b = journal.get("d1"), journal.get("d2")
    assert a is not None and a.state is JournalState.RUNNING and a.boot_id == "b1" and a.plan_digest == "p"
    assert b is not None and b.state is JournalState.SUCCEEDED and b.attempt == 2
    assert journal.get("missing") is None


def test_journal_forget_selected_and_all(tmp_path: Path) -> None:
    journal = Journal(open_db(tmp_path))
    for d in ("a", "b", "c"):
        journal.record(d, d, JournalState.SUCCEEDED)
    assert journal.forget(["a", "zzz"]) == 1
    assert journal.get("a") is None and journal.get("b") is not None
    assert journal.forget() == 2
    assert journal.entries() == []


def test_journal_file_is_private(tmp_path: Path) -> None:
    open_db(tmp_path)
    assert (tmp_path / "state.db").stat().st_mode & 0o077 == 0


def ev(step: str) -> Event:
    return Event(kind=EventKind.OUTPUT, step=step, lines=(f"line of {step}",))


def test_outbox_numbers_events_in_order_and_never_reuses(tmp_path: Path) -> None:
    db = open_db(tmp_path)
    box = Outbox(db)
    first = box.append([ev("a"), ev("b")])
    assert [e.seq for e in first] == [1, 2]
    assert all(e.time_ms > 0 for e in first)
    box.ack(2)
    db.close()
    box = Outbox(open_db(tmp_path))
    assert [e.seq for e in box.append([ev("c")])] == [3]  # numbers survive restarts and acks


def test_outbox_keeps_unacked_events_across_restarts(tmp_path: Path) -> None:
    db = open_db(tmp_path)
    Outbox(db).append([ev("a"), ev("b"), ev("c")])
    Outbox(db).ack(1)
    db.close()
    box = Outbox(open_db(tmp_path))
    pending = box.pending()
    assert [e.seq for e in pending] == [2, 3]
    assert pending[0].lines == ("line of b",)
    assert box.acked_seq == 1
    assert [e.seq for e in box.pending(after_seq=2)] == [3]


def test_outbox_ack_is_cumulative_and_idempotent(tmp_path: Path) -> None:
    box = Outbox(open_db(tmp_path))
    box.append([ev(str(i)) for i in range(5)])
    assert box.ack(3) == 3
    assert box.ack(3) == 0
    assert box.ack(2) == 0 and box.acked_seq == 3
    assert box.count() == 2


def test_outbox_start_at_moves_numbering_forward_only(tmp_path: Path) -> None:
    box = Outbox(open_db(tmp_path))
    box.start_at(41)
    assert [e.seq for e in box.append([ev("x")])] == [41]
    box.start_at(10)
    assert [e.seq for e in box.append([ev("y")])] == [42]


def test_journal_and_outbox_commit_together_or_not_at_all(tmp_path: Path) -> None:
    db = open_db(tmp_path)
    journal, box = Journal(db), Outbox(db)
    try:
        with db.transaction():
            journal.record("d", "s", JournalState.SUCCEEDED)
            box.append([ev("s")])
            raise RuntimeError("crash between the two writes")
    except RuntimeError:
        pass
    assert journal.get("d") is None
    assert box.count() == 0


def test_write_ahead_log_files_are_private_too(tmp_path: Path) -> None:
    db = open_db(tmp_path)
    Outbox(db).append([ev("a")])
    db.close()
    open_db(tmp_path)  # reopening fixes modes of files created since
    for suffix in ("-wal", "-shm"):
        path = tmp_path / f"state.db{suffix}"
        if path.exists():
            assert path.stat().st_mode & 0o077 == 0, suffix


def test_readonly_open_changes_nothing(tmp_path: Path) -> None:
    db = open_db(tmp_path)
    Outbox(db).append([ev("a")])
    db.close()
    ro = StateDB(tmp_path / "state.db", readonly=True)
    assert Outbox(ro).count() == 1
    with pytest.raises(sqlite3.OperationalError):
        Outbox(ro).append([ev("b")])
