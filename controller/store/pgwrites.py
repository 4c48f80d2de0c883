"""The PostgreSQL store's batched transactions (enrollments, events) and small SQL helpers.

Each runs inside the caller's transaction and returns what the view needs once it commits.
Rows are locked in name order (tokens, then nodes), so replicas never deadlock each other.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from psycopg import AsyncConnection

from tether.controller.store.pgconn import CHANNEL
from tether.controller.store.pgsync import Sender, encode
from tether.controller.store.records import NodeRecord, StepRecord
from tether.controller.store.rows import (
    NODE_COLUMN_COUNT,
    NODE_COLUMNS,
    STEP_COLUMNS,
    TOKEN_COLUMNS,
    event_row,
    node_record,
    node_values,
    step_record,
    step_updates,
    token_record,
)
from tether.controller.tokens import TokenRecord
from tether.nodeagent.model import Event

Conn = AsyncConnection[Any]
Decide = Callable[[TokenRecord | None, NodeRecord | None], tuple[NodeRecord, bool]]
NODE_RETURNING = f"RETURNING {NODE_COLUMNS}, max_seq, rev"
_SET_NODE = ", ".join(f"{c.strip()}=EXCLUDED.{c.strip()}" for c in NODE_COLUMNS.split(",")[1:])
UPSERT_NODE = (
    f"INSERT INTO nodes ({NODE_COLUMNS}) VALUES ({', '.join(['%s'] * NODE_COLUMN_COUNT)}) "
    f"ON CONFLICT (name) DO UPDATE SET {_SET_NODE}, rev=nextval('tether_rev') {NODE_RETURNING}"
)
STEP_UPDATE = (
    "UPDATE node_steps SET state=%s, exit_code=%s, attempt=%s, updated_ms=%s, message=%s, "
    "observed=COALESCE(%s, observed) WHERE node=%s AND name=%s AND digest=%s"
)


@dataclass(frozen=True)
class NodeRow:
    """A node as a write left it: the record, its highest stored seq, its rev."""

    record: NodeRecord
    max_seq: int
    rev: int

    @classmethod
    def of(cls, row: Sequence[Any]) -> NodeRow:
        n = NODE_COLUMN_COUNT
        return cls(node_record(row), int(row[n]), int(row[n + 1]))


async def fetchone(conn: Conn, sql: str, args: Sequence[Any] = ()) -> tuple[Any, ...] | None:
    cur = await conn.execute(sql, args)
    return await cur.fetchone()


async def fetchall(conn: Conn, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    cur = await conn.execute(sql, args)
    return await cur.fetchall()


async def many(conn: Conn, sql: str, rows: Sequence[Sequence[Any]], returning: bool = False) -> list[Any]:
    """executemany in one round trip (pipelined); with ``returning``, every statement's rows."""
    if not rows:
        return []
    async with conn.cursor() as cur:
        await cur.executemany(sql, rows, returning=returning)
        if not returning:
            return []
        out: list[Any] = []
        async for result in cur.results():
            out.extend(await result.fetchall())
        return out


async def notify(conn: Conn, payloads: Sequence[str]) -> None:
    """Tell the other replicas, when this transaction commits."""
    if len(payloads) == 1:
        await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payloads[0]))
    elif payloads:
        await conn.execute("SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p", (CHANNEL, list(payloads)))


async def node_steps(conn: Conn, names: Sequence[str]) -> dict[str, list[StepRecord]]:
    rows = await fetchall(
        conn,
        f"SELECT {STEP_COLUMNS} FROM node_steps WHERE node = ANY(%s) ORDER BY node, ordinal",
        (list(names),),
    )
    out: dict[str, list[StepRecord]] = {n: [] for n in names}
    for r in rows:
        out[r[0]].append(step_record(r))
    return out


# -- enrollments ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Enrollment:
    token_id: str
    node_name: str
    decide: Decide


@dataclass
class Enrolled:
    results: list[NodeRecord | BaseException]
    tokens: dict[str, tuple[TokenRecord, int]]  # id -> (record, rev) as written
    nodes: dict[str, NodeRow]  # as written
    cleared: set[str]  # nodes whose steps went (a fresh machine)


async def enroll_batch(conn: Conn, items: list[Enrollment], replica: Sender) -> Enrolled:
    """Every enrollment in order, as if one after another: each ``decide`` sees the token and
    node as the ones before it left them; a refusal leaves no trace."""
    token_rows = await fetchall(
        conn,
        f"SELECT {TOKEN_COLUMNS} FROM tokens WHERE id = ANY(%s) ORDER BY id FOR UPDATE",
        (sorted({i.token_id for i in items}),),
    )
    tokens = {r[0]: token_record(r) for r in token_rows}
    node_rows = await fetchall(
        conn,
        f"SELECT {NODE_COLUMNS} FROM nodes WHERE name = ANY(%s) ORDER BY name FOR UPDATE",
        (sorted({i.node_name for i in items}),),
    )
    nodes = {r[0]: node_record(r) for r in node_rows}
    out = Enrolled([], {}, {}, set())
    used: Counter[str] = Counter()
    written: dict[str, tuple[Any, ...]] = {}
    for item in items:
        try:
            record, consume = item.decide(tokens.get(item.token_id), nodes.get(item.node_name))
        except Exception as exc:  # a refusal: this one only
            out.results.append(exc)
            continue
        token = tokens.get(item.token_id)
        if consume and token is not None:
            tokens[item.token_id] = replace(token, uses=token.uses + 1)
            used[item.token_id] += 1
        if consume:  # a fresh machine: none of the old one's steps, no quarantine or condition
            out.cleared.add(item.node_name)
        hardware = "{}" if consume else json.dumps(dict(record.hardware))
        nodes[item.node_name] = replace(record, hardware={} if consume else record.hardware)
        written[item.node_name] = node_values(record, hardware)
        out.results.append(record)
    await _enroll_writes(conn, out, used, written, replica)
    return out


async def _enroll_writes(
    conn: Conn, out: Enrolled, used: Counter[str], written: dict[str, tuple[Any, ...]], replica: Sender
) -> None:
    rows = await many(
        conn,
        "UPDATE tokens SET uses=uses+%s, rev=nextval('tether_rev') WHERE id=%s "
        f"RETURNING {TOKEN_COLUMNS}, rev",
        [(n, tid) for tid, n in sorted(used.items())],
        returning=True,
    )
    out.tokens = {r[0]: (token_record(r[:11]), int(r[11])) for r in rows}
    if out.cleared:
        await conn.execute("DELETE FROM node_steps WHERE node = ANY(%s)", (sorted(out.cleared),))
    rows = await many(conn, UPSERT_NODE, [written[n] for n in sorted(written)], returning=True)
    out.nodes = {r[0]: NodeRow.of(r) for r in rows}
    payloads = [encode(replica, "token", t) for t in out.tokens] + [
        encode(replica, "node", n) for n in out.nodes
    ]
    await notify(conn, payloads)


# -- events ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Append:
    node: str
    events: Sequence[Event]


@dataclass
class Appended:
    results: list[int | BaseException]  # each append's contiguous stored seq
    nodes: dict[str, NodeRow]
    steps: dict[str, list[StepRecord]]  # of the nodes whose steps moved


async def append_batch(conn: Conn, items: list[Append], replica: Sender) -> Appended:
    """Store events idempotently by (node, seq), in order, as if one call after another."""
    names = sorted({i.node for i in items})
    rows = await fetchall(
        conn,
        "SELECT name, stored_seq, max_seq FROM nodes WHERE name = ANY(%s) ORDER BY name FOR UPDATE",
        (names,),
    )
    marks = {r[0]: [int(r[1]), int(r[2])] for r in rows}
    present = await _beyond(conn, {n: m[0] for n, m in marks.items() if m[1] > m[0]})
    out = Appended([], {}, {})
    inserts: list[tuple[Any, ...]] = []
    updates: list[tuple[Any, ...]] = []
    for item in items:
        mark = marks.get(item.node)
        if mark is None:
            out.results.append(KeyError(f"unknown node {item.node!r}"))
            continue
        stored = mark[0]
        fresh = [e for e in item.events if e.seq > stored]
        seen = present.setdefault(item.node, set())
        for e in fresh:
            if e.seq not in seen:
                seen.add(e.seq)
                inserts.append(_text(event_row(item.node, e)))
        while mark[0] + 1 in seen:  # the contiguous mark over what is stored now
            mark[0] += 1
        mark[1] = max([mark[1], *(e.seq for e in fresh)])
        updates.extend(_text(u) for u in step_updates(item.node, fresh))
        out.results.append(mark[0])
    await _append_writes(conn, out, marks, inserts, updates, replica)
    return out


def _text(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """PostgreSQL text holds no NUL character (SQLite does): an agent's step name or message with
    one is stored with U+FFFD in its place rather than refused forever."""
    return tuple(v.replace("\x00", "\ufffd") if isinstance(v, str) and "\x00" in v else v for v in row)


async def _beyond(conn: Conn, gaps: dict[str, int]) -> dict[str, set[int]]:
    """The seqs stored past each node's contiguous mark (only nodes with a gap)."""
    if not gaps:
        return {}
    rows = await fetchall(
        conn,
        "SELECT e.node, e.seq FROM events e JOIN unnest(%s::text[], %s::bigint[]) AS g(node, mark) "
        "ON e.node = g.node AND e.seq > g.mark",
        (list(gaps), list(gaps.values())),
    )
    out: dict[str, set[int]] = {}
    for node, seq in rows:
        out.setdefault(node, set()).add(int(seq))
    return out


async def _append_writes(
    conn: Conn,
    out: Appended,
    marks: dict[str, list[int]],
    inserts: list[tuple[Any, ...]],
    updates: list[tuple[Any, ...]],
    replica: Sender,
) -> None:
    if not inserts and not updates:
        return
    touched = sorted({r[0] for r in inserts} | {u[6] for u in updates})
    await many(conn, "INSERT INTO events VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING", inserts)
    await many(conn, STEP_UPDATE, updates)
    rows = await many(
        conn,
        "UPDATE nodes SET stored_seq=%s, max_seq=%s, rev=nextval('tether_rev') "
        f"WHERE name=%s {NODE_RETURNING}",
        [(marks[n][0], marks[n][1], n) for n in touched],
        returning=True,
    )
    out.nodes = {r[0]: NodeRow.of(r) for r in rows}
    if updates:
        out.steps = await node_steps(conn, sorted({u[6] for u in updates}))
    await notify(conn, [encode(replica, "events", n, row.max_seq) for n, row in out.nodes.items()])
