"""The PostgreSQL store's one-transaction writes: environments, tokens, nodes, kv, acks, audit.

Each locks what it reads (``FOR UPDATE``), writes, sends its notice in the same transaction,
and once committed puts what it wrote into the view (``View.own``: read-your-writes).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import astuple, replace
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

import tether.controller.store.base as base
from tether.controller.errors import StoreError, check_generation
from tether.controller.store.pgconn import UNREACHABLE, unavailable
from tether.controller.store.pgsync import Sender, encode
from tether.controller.store.pgview import View
from tether.controller.store.pgwrites import (
    NODE_RETURNING,
    Conn,
    NodeRow,
    fetchall,
    fetchone,
    many,
    node_steps,
    notify,
)
from tether.controller.store.records import AuditRecord, EnvironmentRecord, StepRecord
from tether.controller.store.rows import (
    AUDIT_COLUMNS,
    ENV_COLUMNS,
    NODE_FIELDS,
    TOKEN_COLUMNS,
    encode_json,
    env_record,
    event_row,
    plan_step_rows,
    step_record,
    token_record,
    token_values,
)
from tether.controller.tokens import TokenRecord
from tether.nodeagent.model import Event, EventKind, Plan, now_ms

T = TypeVar("T")
ATTEMPTS = 5


# A node's periodic health report (one a minute per node) is not told to the other replicas: it
# changes no node's state, and each notice costs every other replica a re-read of the node and its
# steps (with 5,000 agents, 2 replicas spent 1.6x the CPU per heartbeat of one). The others read it
# when asked for it (``refresh_node``: ``tetherctl node describe``) or with the node's next change.
QUIET_NODE_FIELDS = frozenset({"health", "last_seen_ms"})


class Writes:
    url: str
    replica_id: str
    _sender: Sender  # signs this replica's notices
    _pool: AsyncConnectionPool[Any]
    _observe: Callable[[float, int], None] | None
    _view: View
    _checking: asyncio.Task[None] | None = None

    # -- the transaction ------------------------------------------------------------------------

    async def _tx(self, fn: Callable[[Conn], Awaitable[T]], writes: int = 1) -> T:
        """``fn`` in one transaction. A connection found broken at BEGIN (the database restarted)
        is replaced at once; a deadlock or serialization failure runs ``fn`` again; the database
        away: StoreError "store unavailable: ...". Other errors as they are."""
        for attempt in range(ATTEMPTS):
            began, last = False, attempt == ATTEMPTS - 1
            started = time.perf_counter()
            try:
                async with self._pool.connection() as conn, conn.transaction():
                    began = True
                    result = await fn(conn)
            except psycopg.errors.TransactionRollback:
                if last:
                    raise
                await asyncio.sleep(0.01 * (attempt + 1))
                continue
            except UNREACHABLE as exc:
                if (
                    began
                    or last
                    or isinstance(exc, PoolTimeout)
                    or not isinstance(exc, psycopg.OperationalError)
                ):
                    self._recheck_soon()
                    if began:  # it may have committed: read it back (own notices are not heard)
                        self._unsure()
                    raise unavailable(exc, self.url) from None
                await self._recheck()
                continue
            except psycopg.Error as exc:  # refused by the database (bad data): one line, no values
                raise StoreError(f"store refused the write: {type(exc).__name__} ({exc.sqlstate})") from None
            if self._observe is not None:
                self._observe(time.perf_counter() - started, writes)
            return result
        raise AssertionError("not reached")

    def _unsure(self) -> None:
        """A write whose commit is in doubt: re-read the view from the database (the backend's)."""

    def _recheck_soon(self) -> asyncio.Task[None]:
        """A connection broke (the database restarted?): have the pool test its idle ones now,
        not each on its next use (one check at a time)."""
        if self._checking is None or self._checking.done():
            self._checking = asyncio.get_running_loop().create_task(self._pool.check())
        return self._checking

    async def _recheck(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.shield(self._recheck_soon())

    def _node_written(self, row: NodeRow, steps: list[StepRecord] | None = None) -> None:
        """A node as an own write left it (``steps`` None: they did not change)."""
        view, name = self._view, row.record.name
        kept = view.steps.get(name, []) if steps is None else steps
        view.own(
            ("node", name), row.rev, functools.partial(view.set_node, name, (row.record, kept, row.max_seq))
        )

    def _gone(self, kind: str, name: str, rev: int) -> None:
        """An own delete: the view forgets ``name`` unless a newer own write put it back."""
        view = self._view
        if kind == "node":
            view.own((kind, name), rev, functools.partial(view.set_node, name, None))
        elif kind == "env":
            view.own((kind, name), rev, functools.partial(view.set_env, name, None))
        else:
            view.own((kind, name), rev, functools.partial(view.set_kv, name, None))

    def _notice(self, kind: str, key: str, seq: int = 0) -> str:
        return encode(self._sender, kind, key, seq)

    # -- environments ---------------------------------------------------------------------------

    async def put_environment(
        self,
        name: str,
        document: str,
        api_version: str,
        spec: Mapping[str, Any],
        agent_version: str | None = None,
        expected_generation: int = 0,
    ) -> tuple[EnvironmentRecord, bool]:
        spec_json = json.dumps(spec, sort_keys=True)

        async def fn(conn: Conn) -> tuple[EnvironmentRecord, bool, int, list[int]]:
            last = await _lock_environment(conn, name)
            row = await fetchone(conn, f"SELECT {ENV_COLUMNS} FROM environments WHERE name=%s", (name,))
            check_generation(name, row[4] if row else None, expected_generation)  # in the same transaction
            agent = (row[7] if row else "") if agent_version is None else agent_version
            if row is not None and row[3] == spec_json and row[1] == document and row[7] == agent:
                return env_record(row), False, 0, []
            # Generations never repeat for a name, even across delete and re-create (caches key on them).
            generation = max(row[4] if row else 0, last) + 1
            now = now_ms()
            values = (name, document, api_version, spec_json, generation, row[5] if row else now, now, agent)
            rev, pruned = await _write_environment(conn, values)
            await notify(conn, [self._notice("environment", name)])
            return env_record(values), True, rev, pruned

        record, changed, rev, pruned = await self._tx(fn)
        if changed:
            kept = {g: r for g, r in self._view.revisions.get(name, {}).items() if g not in pruned}
            kept[record.generation] = replace(record, created_ms=record.updated_ms)
            self._view.own(("env", name), rev, functools.partial(self._view.set_env, name, (record, kept)))
        return record, changed

    async def delete_environment(self, name: str) -> bool:
        async def fn(conn: Conn) -> tuple[bool, int]:
            await _lock_environment(conn, name)
            await conn.execute("DELETE FROM environment_revisions WHERE name=%s", (name,))
            deleted = await fetchone(conn, "DELETE FROM environments WHERE name=%s RETURNING 1", (name,))
            if deleted:
                await notify(conn, [self._notice("environment_deleted", name)])
            return deleted is not None, await _next_rev(conn)

        deleted, rev = await self._tx(fn)
        self._gone("env", name, rev)
        return deleted

    # -- tokens ---------------------------------------------------------------------------------

    async def put_token(self, record: TokenRecord) -> None:
        async def fn(conn: Conn) -> int:
            row = await fetchone(
                conn,
                f"INSERT INTO tokens ({TOKEN_COLUMNS}) VALUES ({', '.join(['%s'] * 11)}) RETURNING rev",
                token_values(record),
            )
            await notify(conn, [self._notice("token", record.id)])
            return int(row[0]) if row else 0

        rev = await self._tx(fn)
        self._view.own(("token", record.id), rev, functools.partial(self._view.set_token, record.id, record))

    async def revoke_token(self, token_id: str) -> bool:
        async def fn(conn: Conn) -> tuple[Any, ...] | None:
            row = await fetchone(
                conn,
                "UPDATE tokens SET revoked=true, rev=nextval('tether_rev') WHERE id=%s "
                f"RETURNING {TOKEN_COLUMNS}, rev",
                (token_id,),
            )
            if row is not None:
                await notify(conn, [self._notice("token", token_id)])
            return row

        row = await self._tx(fn)
        if row is None:
            return False
        self._view.own(
            ("token", token_id),
            int(row[11]),
            functools.partial(self._view.set_token, token_id, token_record(row[:11])),
        )
        return True

    # -- nodes ----------------------------------------------------------------------------------

    async def update_node(self, name: str, **fields: Any) -> None:
        unknown = set(fields) - NODE_FIELDS
        if unknown:
            raise ValueError(f"unknown node fields: {sorted(unknown)}")
        if not fields:
            return
        cols = ", ".join(f"{k}=%s" for k in fields)
        values = [encode_json(v) for v in fields.values()]
        sql = f"UPDATE nodes SET {cols}, rev=nextval('tether_rev') WHERE name=%s {NODE_RETURNING}"
        await self._node_tx(sql, (*values, name), tell=not set(fields) <= QUIET_NODE_FIELDS)

    async def _node_tx(self, sql: str, args: Sequence[Any], tell: bool = True) -> None:
        """One statement that updates one node and returns it (the others told unless not ``tell``)."""

        async def fn(conn: Conn) -> tuple[Any, ...] | None:
            row = await fetchone(conn, sql, args)
            if row is not None and tell:
                await notify(conn, [self._notice("node", row[0])])
            return row

        row = await self._tx(fn)
        if row is not None:
            self._node_written(NodeRow.of(row))

    async def patch_node_hardware(self, name: str, changes: Mapping[str, Any]) -> None:
        """Set keys of the node's ``hardware`` record (None removes one) in one write."""
        patch = dict(changes)

        async def fn(conn: Conn) -> tuple[Any, ...] | None:
            row = await fetchone(conn, "SELECT hardware FROM nodes WHERE name=%s FOR UPDATE", (name,))
            if row is None:
                return None
            hardware = json.loads(row[0])
            for key, value in patch.items():
                if value is None:
                    hardware.pop(key, None)
                else:
                    hardware[key] = value
            sql = f"UPDATE nodes SET hardware=%s, rev=nextval('tether_rev') WHERE name=%s {NODE_RETURNING}"
            updated = await fetchone(conn, sql, (json.dumps(hardware, sort_keys=True), name))
            await notify(conn, [self._notice("node", name)])
            return updated

        row = await self._tx(fn)
        if row is not None:
            self._node_written(NodeRow.of(row))

    async def set_node_plan(self, name: str, plan: Plan) -> None:
        async def fn(conn: Conn) -> tuple[tuple[Any, ...] | None, list[tuple[Any, ...]]]:
            await conn.execute("SELECT 1 FROM nodes WHERE name=%s FOR UPDATE", (name,))
            old = await fetchall(
                conn,
                "SELECT name, digest, state, exit_code, attempt, updated_ms, message, observed "
                "FROM node_steps WHERE node=%s",
                (name,),
            )
            await conn.execute("DELETE FROM node_steps WHERE node=%s", (name,))
            rows = plan_step_rows(name, plan.steps, {r[0]: r for r in old})
            await many(conn, f"INSERT INTO node_steps VALUES ({', '.join(['%s'] * 12)})", rows)
            sql = (
                "UPDATE nodes SET plan_generation=%s, plan_digest=%s, rev=nextval('tether_rev') "
                f"WHERE name=%s {NODE_RETURNING}"
            )
            row = await fetchone(conn, sql, (plan.generation, plan.digest, name))
            if row is not None:
                await notify(conn, [self._notice("node", name)])
            return row, rows

        row, rows = await self._tx(fn)
        if row is not None:
            self._node_written(NodeRow.of(row), [step_record(r) for r in rows])

    async def reset_steps(self, name: str, steps: Sequence[str]) -> None:
        async def fn(conn: Conn) -> tuple[tuple[Any, ...] | None, list[StepRecord]]:
            if steps:
                await many(
                    conn,
                    "UPDATE node_steps SET state='pending' WHERE node=%s AND name=%s",
                    [(name, s) for s in steps],
                )
            else:
                await conn.execute("UPDATE node_steps SET state='pending' WHERE node=%s", (name,))
            sql = f"UPDATE nodes SET rev=nextval('tether_rev') WHERE name=%s {NODE_RETURNING}"
            row = await fetchone(conn, sql, (name,))
            if row is None:
                return None, []
            await notify(conn, [self._notice("node", name)])
            return row, (await node_steps(conn, [name]))[name]

        row, after = await self._tx(fn)
        if row is not None:
            self._node_written(NodeRow.of(row), after)

    async def delete_node(self, name: str) -> bool:
        """Forget a node: its record, its steps and every event it reported, in one transaction."""

        async def fn(conn: Conn) -> tuple[bool, int]:
            await conn.execute("SELECT 1 FROM nodes WHERE name=%s FOR UPDATE", (name,))
            await conn.execute("DELETE FROM node_steps WHERE node=%s", (name,))
            await conn.execute("DELETE FROM events WHERE node=%s", (name,))
            deleted = await fetchone(conn, "DELETE FROM nodes WHERE name=%s RETURNING 1", (name,))
            if deleted:
                await notify(conn, [self._notice("node_deleted", name)])
            return deleted is not None, await _next_rev(conn)

        deleted, rev = await self._tx(fn)
        self._gone("node", name, rev)
        return deleted

    async def accept_acked(self, node: str, acked_seq: int) -> int:
        """The agent says events up to ``acked_seq`` were acknowledged and this store is behind
        (restored from an earlier copy): record the gap as one event and take its boundary."""

        async def fn(conn: Conn) -> tuple[int, tuple[Any, ...] | None]:
            row = await fetchone(conn, "SELECT stored_seq FROM nodes WHERE name=%s FOR UPDATE", (node,))
            if row is None:
                raise KeyError(f"unknown node {node!r}")
            stored = int(row[0])
            if acked_seq <= stored:
                return stored, None
            gap = Event(
                kind=EventKind.INFO,
                seq=stored + 1,
                time_ms=now_ms(),
                message=(
                    f"events {stored + 1}..{acked_seq} were acknowledged before this controller's "
                    "store was restored from an earlier copy; they are missing here"
                ),
            )
            await conn.execute(
                "INSERT INTO events VALUES (%s,%s,%s,%s,%s,%s) ON CONFLICT DO NOTHING", event_row(node, gap)
            )
            mark = acked_seq
            for (seq,) in await fetchall(
                conn, "SELECT seq FROM events WHERE node=%s AND seq>%s ORDER BY seq", (node, mark)
            ):
                if seq != mark + 1:
                    break
                mark = seq
            sql = (
                "UPDATE nodes SET stored_seq=%s, max_seq=GREATEST(max_seq, %s), rev=nextval('tether_rev') "
                f"WHERE name=%s {NODE_RETURNING}"
            )
            updated = await fetchone(conn, sql, (mark, max(mark, stored + 1), node))
            await notify(conn, [self._notice("events", node, max(mark, stored + 1))])
            return mark, updated

        mark, row = await self._tx(fn)
        if row is not None:
            self._node_written(NodeRow.of(row))
        return mark

    # -- key/value ------------------------------------------------------------------------------

    async def kv_put(self, key: str, value: bytes) -> None:
        async def fn(conn: Conn) -> int:
            row = await fetchone(
                conn,
                "INSERT INTO kv (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE "
                "SET value=EXCLUDED.value, rev=nextval('tether_rev') RETURNING rev",
                (key, value),
            )
            await notify(conn, [self._notice("kv", key)])
            return int(row[0]) if row else 0

        rev = await self._tx(fn)
        self._view.own(("kv", key), rev, functools.partial(self._view.set_kv, key, bytes(value)))

    async def kv_put_if_absent(self, key: str, value: bytes) -> bytes:
        """``value`` stored under ``key`` unless one already is; the value stored now (two
        replicas racing: both get the same one)."""

        async def fn(conn: Conn) -> tuple[bytes, int]:
            row = await fetchone(
                conn,
                "INSERT INTO kv (key, value) VALUES (%s, %s) ON CONFLICT DO NOTHING RETURNING value, rev",
                (key, value),
            )
            if row is not None:
                await notify(conn, [self._notice("kv", key)])
            else:
                row = await fetchone(conn, "SELECT value, rev FROM kv WHERE key=%s", (key,))
                if row is None:  # deleted between: try again
                    raise psycopg.errors.SerializationFailure("kv key deleted meanwhile")
            return bytes(row[0]), int(row[1])

        stored, rev = await self._tx(fn)
        self._view.own(("kv", key), rev, functools.partial(self._view.set_kv, key, stored))
        return stored

    async def kv_delete(self, key: str) -> None:
        async def fn(conn: Conn) -> int:
            if await fetchone(conn, "DELETE FROM kv WHERE key=%s RETURNING 1", (key,)):
                await notify(conn, [self._notice("kv", key)])
            return await _next_rev(conn)

        self._gone("kv", key, await self._tx(fn))


# -- helpers -----------------------------------------------------------------------------------------


async def _next_rev(conn: Conn) -> int:
    row = await fetchone(conn, "SELECT nextval('tether_rev')")
    return int(row[0]) if row else 0


async def _lock_environment(conn: Conn, name: str) -> int:
    """Lock ``name``'s generation counter (every writer of that environment queues here); the
    last generation it ever had."""
    await conn.execute("INSERT INTO environment_generations VALUES (%s, 0) ON CONFLICT DO NOTHING", (name,))
    row = await fetchone(
        conn, "SELECT generation FROM environment_generations WHERE name=%s FOR UPDATE", (name,)
    )
    return int(row[0]) if row else 0


async def _write_environment(conn: Conn, values: tuple[Any, ...]) -> tuple[int, list[int]]:
    """Write the environment and its revision, prune old revisions: (rev, generations pruned)."""
    name, document, api_version, spec_json, generation, _, now, agent = values
    await conn.execute("UPDATE environment_generations SET generation=%s WHERE name=%s", (generation, name))
    sets = ", ".join(f"{c.strip()}=EXCLUDED.{c.strip()}" for c in ENV_COLUMNS.split(",")[1:])
    row = await fetchone(
        conn,
        f"INSERT INTO environments ({ENV_COLUMNS}) VALUES ({', '.join(['%s'] * 8)}) "
        f"ON CONFLICT (name) DO UPDATE SET {sets}, rev=nextval('tether_rev') RETURNING rev",
        values,
    )
    await conn.execute(
        "INSERT INTO environment_revisions VALUES (%s,%s,%s,%s,%s,%s,%s) "
        "ON CONFLICT (name, generation) DO UPDATE SET document=EXCLUDED.document, "
        "api_version=EXCLUDED.api_version, spec=EXCLUDED.spec, "
        "created_ms=EXCLUDED.created_ms, agent_version=EXCLUDED.agent_version",
        (name, generation, document, api_version, spec_json, now, agent),
    )
    pruned = await fetchall(
        conn,
        "WITH k AS (SELECT generation AS keep FROM environment_revisions WHERE name=%(n)s "
        "ORDER BY generation DESC OFFSET %(off)s LIMIT 1), "
        "u AS (SELECT MIN(plan_generation) AS used FROM nodes "
        "WHERE environment=%(n)s AND plan_generation > 0) "
        "DELETE FROM environment_revisions r USING k, u "
        "WHERE r.name=%(n)s AND r.generation < LEAST(k.keep, COALESCE(u.used, k.keep)) "
        "RETURNING r.generation",
        {"n": name, "off": base.KEEP_REVISIONS - 1},  # type: ignore[arg-type]
    )
    return (int(row[0]) if row else 0), [int(r[0]) for r in pruned]


async def append_audit(conn: Conn, record: AuditRecord) -> AuditRecord:
    """Store ``record`` under the next id; the oldest past KEEP_AUDIT_RECORDS successful records or
    KEEP_AUDIT_REFUSALS refusals go, each bound trimmed apart."""
    values = astuple(record)[1:]
    row = await fetchone(
        conn, f"INSERT INTO audit ({AUDIT_COLUMNS}) VALUES ({', '.join(['%s'] * 10)}) RETURNING id", values
    )
    counts = await fetchone(conn, "SELECT count(*) FILTER (WHERE outcome <> 'ok'), count(*) FROM audit")
    refusals, total = (int(counts[0]), int(counts[1])) if counts else (0, 0)
    for op, excess in (
        ("<>", refusals - base.KEEP_AUDIT_REFUSALS),
        ("=", total - refusals - base.KEEP_AUDIT_RECORDS),
    ):
        if excess > 0:
            await conn.execute(
                "DELETE FROM audit WHERE id IN "
                f"(SELECT id FROM audit WHERE outcome {op} 'ok' ORDER BY id LIMIT %s)",
                (excess,),
            )
    return replace(record, id=int(row[0]) if row else 0)
