"""Issue 10 item 3: the outbox never holds or sends a batch larger than EVENT_BATCH_BYTES."""

from __future__ import annotations

import json
from pathlib import Path

from tether.nodeagent import wire
from tether.nodeagent.bounds import cut_text
from tether.nodeagent.limits import EVENT_BATCH_BYTES, EVENT_BATCH_COUNT, MAX_LINE_BYTES
from tether.nodeagent.model import Event, EventKind
from tether.nodeagent.outbox import Outbox
from tether.nodeagent.statedb import StateDB


def drain(box: Outbox) -> list[list[Event]]:
    batches: list[list[Event]] = []
    last = 0
    while batch := box.pending(after_seq=last):
        batches.append(batch)
        last = batch[-1].seq
    return batches


def encoded(batch: list[Event]) -> int:
    return wire.pb.AgentMessage(events=wire.events_to_pb(batch)).ByteSize()


def test_batches_of_huge_events_stay_under_the_byte_bound_and_lose_no_line(tmp_path: Path) -> None:
    box = Outbox(StateDB(tmp_path / "state.db"))
    lines = tuple(f"{i:06d} " + "é" * 4000 for i in range(600))  # 8 KB each, 4.8 MB together
    for _ in range(3):
        box.append([Event(kind=EventKind.OUTPUT, step="chatty", lines=lines)])
    box.append([Event(kind=EventKind.SUCCEEDED, step="chatty", lines=lines[:200], message="done")])
    batches = drain(box)
    assert all(encoded(b) <= EVENT_BATCH_BYTES and len(b) <= EVENT_BATCH_COUNT for b in batches)
    events = [e for b in batches for e in b]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [line for e in events for line in e.lines] == list(lines) * 3 + list(lines[:200])
    # The split lines went ahead as output; the success comes once, last.
    assert [e.kind for e in events].count(EventKind.SUCCEEDED) == 1
    assert events[-1].kind is EventKind.SUCCEEDED and events[-1].message == "done"
    assert {e.kind for e in events[:-1]} == {EventKind.OUTPUT}


def test_many_small_events_are_bounded_by_count_and_by_bytes(tmp_path: Path) -> None:
    box = Outbox(StateDB(tmp_path / "state.db"))
    box.append([Event(kind=EventKind.OUTPUT, step="s", lines=("x" * 2000,)) for _ in range(1200)])
    batches = drain(box)
    assert sum(len(b) for b in batches) == 1200
    assert all(encoded(b) <= EVENT_BATCH_BYTES for b in batches)
    assert max(len(b) for b in batches) < EVENT_BATCH_COUNT  # 500 x 2 KB would be 1 MB: bytes bind
    box.append([Event(kind=EventKind.INFO, message="tiny") for _ in range(1200)])
    assert len(box.pending(after_seq=1200)) == EVENT_BATCH_COUNT  # and here the count does


def test_an_over_long_line_is_cut_and_says_so(tmp_path: Path) -> None:
    box = Outbox(StateDB(tmp_path / "state.db"))
    (e,) = box.append([Event(kind=EventKind.OUTPUT, step="s", lines=("a" * 81234, "short"))])
    assert e.lines[1] == "short"
    assert e.lines[0].endswith(" … [tether: line cut, 81234 bytes]") and e.lines[0].startswith("aaaa")
    assert len(e.lines[0].encode()) <= MAX_LINE_BYTES
    assert box.pending() == [e]  # as stored


def test_cutting_never_splits_a_character() -> None:
    cut = cut_text("€" * 10_000)
    assert len(cut.encode()) <= MAX_LINE_BYTES and cut.startswith("€" * 100)
    assert "\ufffd" not in cut and cut_text("€" * 100) == "€" * 100


def test_a_too_large_event_stored_by_an_older_agent_is_cut_not_a_poison_message(tmp_path: Path) -> None:
    db = StateDB(tmp_path / "state.db")
    big = Event(kind=EventKind.OUTPUT, step="s", seq=1, lines=tuple("y" * 8000 for _ in range(500)))
    with db.transaction() as c:
        c.execute("INSERT INTO outbox VALUES (1, ?)", (json.dumps(big.to_json()),))
        c.execute("INSERT INTO outbox VALUES (2, ?)", (json.dumps(Event(EventKind.INFO, seq=2).to_json()),))
    box = Outbox(db)
    batches = drain(box)
    assert [e.seq for b in batches for e in b] == [1, 2]
    assert all(encoded(b) <= EVENT_BATCH_BYTES for b in batches)
    cut = batches[0][0]
    assert cut.lines[-1].startswith("… [tether: ") and " lines cut, " in cut.lines[-1]
    assert cut.lines[:-1] == big.lines[: len(cut.lines) - 1]  # the start is kept as it was
