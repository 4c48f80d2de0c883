"""Events cut and split to fit the wire, so that no event is ever too large to send.

A line (or message, or observed value) over ``MAX_LINE_BYTES`` is cut and says so. An event
whose encoded size is over what one batch may hold is split before it is numbered: its lines
go ahead in OUTPUT events of the same step, and the event itself follows with the rest.
``shrink`` is for an event already numbered (an outbox written by an older agent): it cannot be
split, so it keeps the lines that fit and says how many were cut.
"""

from __future__ import annotations

from dataclasses import replace

from tether.nodeagent import logs, wire
from tether.nodeagent.limits import EVENT_BATCH_BYTES, MAX_LINE_BYTES
from tether.nodeagent.model import Event, EventKind

log = logs.get_logger("tether.agent.outbox")

# The largest ``wire.batch_cost`` of one event: a batch of that event alone fits the limit.
EVENT_BUDGET = EVENT_BATCH_BYTES - wire.BATCH_ENVELOPE_BYTES
_MAX_SEQ = 2**64 - 1  # numbers are given after the split: count the widest
_LENGTH_BYTES = 4  # an event's own length prefix, at most (EVENT_BUDGET < 2**28)
_MAP_ENTRY_BYTES = 16  # framing of one observed entry, at most
_UPPER_FIXED_BYTES = 256  # an event's numbers and tags, and its own framing, at most
_UPPER_FRAMING_BYTES = 16  # framing of one line or map string, at most


def cut_text(text: str, limit: int = MAX_LINE_BYTES, *, more: bool = False) -> str:
    """``text`` if it fits in ``limit`` bytes (UTF-8), else its start and a note saying so.

    ``more``: ``text`` is already the start of something longer (the note says "more than").
    """
    if len(text) <= limit // 4 and not more:  # a character is at most 4 bytes
        return text
    raw = text.encode()
    if len(raw) <= limit and not more:
        return text
    size = f"more than {len(raw)}" if more else str(len(raw))
    note = f" … [tether: line cut, {size} bytes]"
    return raw[: limit - len(note.encode())].decode("utf-8", errors="ignore") + note


def fit(e: Event, budget: int = EVENT_BUDGET) -> list[Event]:
    """``e`` as events that each fit ``budget``: one unless its lines do not fit one."""
    e = _cut_fields(e, budget)
    if _fits(e, budget):
        return [e]
    chunks = _chunks(e, budget)
    head = e if e.kind is EventKind.OUTPUT else _output_of(e)
    return [replace(head, lines=c) for c in chunks[:-1]] + [replace(e, lines=chunks[-1])]


def shrink(e: Event, budget: int = EVENT_BUDGET) -> Event:
    """``e`` (numbered already) made to fit ``budget``: the lines beyond it are cut, and it says so."""
    if _fits(e, budget):
        return e
    e = _cut_fields(e, budget)
    chunks = _chunks(e, budget)
    if len(chunks) == 1:
        return replace(e, lines=chunks[0])
    kept = chunks[0][:-1]  # the last one makes room for the note
    cut = e.lines[len(kept) :]
    note = f"… [tether: {len(cut)} lines cut, {sum(len(line.encode()) for line in cut)} bytes]"
    return replace(e, lines=(*kept, note))


def _fits(e: Event, budget: int) -> bool:
    """Whether ``e`` fits ``budget`` encoded; most events are far below it, and an upper bound
    (4 bytes a character, generous framing) says so without encoding them."""
    chars = len(e.step) + len(e.digest) + len(e.message) + sum(len(line) for line in e.lines)
    chars += sum(len(k) + len(v) for k, v in e.observed.items())
    framing = _UPPER_FIXED_BYTES + _UPPER_FRAMING_BYTES * (len(e.lines) + 3 * len(e.observed))
    return 4 * chars + framing <= budget or wire.batch_cost(e) <= budget


def _cut_fields(e: Event, budget: int) -> Event:
    """Every line, the message and the observed values cut to a line's limit; observed entries
    beyond half the budget dropped, so that at least half of it is left for lines."""
    short = MAX_LINE_BYTES // 4  # characters that surely fit a line's limit
    if not e.observed and len(e.message) <= short and all(len(line) <= short for line in e.lines):
        return e  # nothing to cut (most events)
    observed: dict[str, str] = {}
    used = 0
    for k, v in e.observed.items():
        k, v = cut_text(k), cut_text(v)
        used += len(k.encode()) + len(v.encode()) + _MAP_ENTRY_BYTES
        if used > budget // 2:
            log.warning("observed values cut", step=e.step, kept=len(observed), total=len(e.observed))
            break
        observed[k] = v
    return replace(
        e,
        lines=tuple(cut_text(line) for line in e.lines),
        message=cut_text(e.message),
        observed=observed,
    )


def _chunks(e: Event, budget: int) -> list[tuple[str, ...]]:
    """``e.lines`` in runs that each fit ``budget`` next to the rest of ``e`` (never empty)."""
    base = wire.event_to_pb(replace(e, lines=(), seq=_MAX_SEQ)).ByteSize()
    room = budget - 1 - _LENGTH_BYTES - base  # at least half the budget: many cut lines
    chunks: list[tuple[str, ...]] = []
    current: list[str] = []
    used = 0
    for line in e.lines:
        cost = wire.line_cost(line)
        if current and used + cost > room:
            chunks.append(tuple(current))
            current, used = [], 0
        current.append(line)
        used += cost
    chunks.append(tuple(current))
    return chunks


def _output_of(e: Event) -> Event:
    """An OUTPUT event of the same step and attempt as ``e``, without lines."""
    return Event(
        kind=EventKind.OUTPUT,
        step=e.step,
        digest=e.digest,
        attempt=e.attempt,
        time_ms=e.time_ms,
        plan_generation=e.plan_generation,
    )
