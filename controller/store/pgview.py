"""The PostgreSQL store's in-memory view: what the synchronous reads answer from.

Every row the view holds carries its ``rev`` (one database sequence, bumped by every write of
the row): an own write is applied at commit only if its rev is not older than what the view
has (two own writes of one row finishing out of order). A re-read (another replica's change,
or a reconnect) is applied only if no own write of that key was applied while it ran (its
``stamp`` did not move); else the key is read again. Events are not held, only each node's
highest stored seq.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection

from tether.controller.store.records import EnvironmentRecord, NodeRecord, StepRecord
from tether.controller.store.rows import (
    ENV_COLUMNS,
    NODE_COLUMN_COUNT,
    NODE_COLUMNS,
    STEP_COLUMNS,
    TOKEN_COLUMNS,
    env_record,
    node_record,
    step_record,
    token_record,
)
from tether.controller.tokens import TokenRecord

Key = tuple[str, str]  # ("node" | "env" | "token" | "kv", name)
NodeState = tuple[NodeRecord, list[StepRecord], int]  # record, steps, highest stored seq
EnvState = tuple[EnvironmentRecord, dict[int, EnvironmentRecord]]  # record, kept revisions


@dataclass
class Snapshot:
    """Rows read in one transaction; a key asked for and absent here is gone."""

    nodes: dict[str, tuple[NodeState, int]] = field(default_factory=dict)
    envs: dict[str, tuple[EnvState, int]] = field(default_factory=dict)
    tokens: dict[str, tuple[TokenRecord, int]] = field(default_factory=dict)
    kv: dict[str, tuple[bytes, int]] = field(default_factory=dict)

    def keys(self) -> set[Key]:
        out: set[Key] = {("node", k) for k in self.nodes} | {("env", k) for k in self.envs}
        return out | {("token", k) for k in self.tokens} | {("kv", k) for k in self.kv}


class View:
    def __init__(self) -> None:
        self.environments: dict[str, EnvironmentRecord] = {}
        self.revisions: dict[str, dict[int, EnvironmentRecord]] = {}
        self.tokens: dict[str, TokenRecord] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self.names: list[str] = []  # node names, sorted (pages)
        self.steps: dict[str, list[StepRecord]] = {}
        self.max_seq: dict[str, int] = {}
        self.kv: dict[str, bytes] = {}
        self._revs: dict[Key, int] = {}
        self._stamps: dict[Key, int] = {}

    # -- versions -----------------------------------------------------------------------------

    def stamps(self, keys: Iterable[Key] | None) -> dict[Key, int]:
        """The own-write counts of ``keys`` (None: all), taken before a re-read starts."""
        if keys is None:
            return dict(self._stamps)
        return {k: self._stamps.get(k, 0) for k in keys}

    def own(self, key: Key, rev: int, apply: Callable[[], None]) -> None:
        """An own committed write of ``key`` at ``rev``."""
        self._stamps[key] = self._stamps.get(key, 0) + 1
        if rev >= self._revs.get(key, 0):
            self._revs[key] = rev
            apply()

    def keys(self) -> set[Key]:
        out: set[Key] = {("node", k) for k in self.nodes} | {("env", k) for k in self.environments}
        return out | {("token", k) for k in self.tokens} | {("kv", k) for k in self.kv}

    def state(self, key: Key) -> Any:
        """What the view holds for ``key`` (compared before and after a re-read)."""
        kind, name = key
        if kind == "node":
            node = self.nodes.get(name)
            return None if node is None else (node, self.steps.get(name), self.max_seq.get(name, 0))
        if kind == "env":
            return self.environments.get(name)
        return self.tokens.get(name) if kind == "token" else self.kv.get(name)

    def apply(self, snap: Snapshot, keys: Iterable[Key], before: dict[Key, int]) -> list[Key]:
        """Apply a re-read of ``keys`` (stamps taken before it ran); the keys to read again."""
        again = []
        for key in keys:
            if self._stamps.get(key, 0) != before.get(key, 0):
                again.append(key)
                continue
            kind, name = key
            if kind == "node":
                found = snap.nodes.get(name)
                self._rev(key, found)
                self.set_node(name, None if found is None else found[0])
            elif kind == "env":
                env = snap.envs.get(name)
                self._rev(key, env)
                self.set_env(name, None if env is None else env[0])
            elif kind == "token":
                token = snap.tokens.get(name)
                self._rev(key, token)
                self.set_token(name, None if token is None else token[0])
            else:
                value = snap.kv.get(name)
                self._rev(key, value)
                self.set_kv(name, None if value is None else value[0])
        return again

    def _rev(self, key: Key, found: tuple[Any, int] | None) -> None:
        if found is not None:
            self._revs[key] = found[1]

    # -- setters (None: gone) -----------------------------------------------------------------

    def set_node(self, name: str, state: NodeState | None) -> None:
        if state is None:
            if self.nodes.pop(name, None) is not None:
                i = bisect.bisect_left(self.names, name)
                if i < len(self.names) and self.names[i] == name:
                    del self.names[i]
            self.steps.pop(name, None)
            self.max_seq.pop(name, None)
            return
        record, steps, max_seq = state
        if name not in self.nodes:
            bisect.insort(self.names, name)
        self.nodes[name] = record
        self.steps[name] = steps
        self.max_seq[name] = max_seq

    def set_env(self, name: str, state: EnvState | None) -> None:
        if state is None:
            self.environments.pop(name, None)
            self.revisions.pop(name, None)
        else:
            self.environments[name], self.revisions[name] = state

    def set_token(self, token_id: str, record: TokenRecord | None) -> None:
        if record is None:
            self.tokens.pop(token_id, None)
        else:
            self.tokens[token_id] = record

    def set_kv(self, key: str, value: bytes | None) -> None:
        if value is None:
            self.kv.pop(key, None)
        else:
            self.kv[key] = value


# -- reading rows (in the caller's REPEATABLE READ transaction) -----------------------------------


def _where(column: str, names: list[str] | None) -> tuple[str, tuple[Any, ...]]:
    return ("", ()) if names is None else (f" WHERE {column} = ANY(%s)", (names,))


async def read_nodes(conn: AsyncConnection[Any], names: list[str] | None) -> dict[str, tuple[NodeState, int]]:
    where, args = _where("name", names)
    cur = await conn.execute(f"SELECT {NODE_COLUMNS}, max_seq, rev FROM nodes{where}", args)
    rows = await cur.fetchall()
    steps: dict[str, list[StepRecord]] = {}
    where, args = _where("node", names)
    cur = await conn.execute(f"SELECT {STEP_COLUMNS} FROM node_steps{where} ORDER BY node, ordinal", args)
    for r in await cur.fetchall():
        steps.setdefault(r[0], []).append(step_record(r))
    n = NODE_COLUMN_COUNT
    return {r[0]: ((node_record(r), steps.get(r[0], []), int(r[n])), int(r[n + 1])) for r in rows}


async def read_envs(conn: AsyncConnection[Any], names: list[str] | None) -> dict[str, tuple[EnvState, int]]:
    where, args = _where("name", names)
    cur = await conn.execute(f"SELECT {ENV_COLUMNS}, rev FROM environments{where}", args)
    rows = await cur.fetchall()
    revisions: dict[str, dict[int, EnvironmentRecord]] = {}
    cur = await conn.execute(
        "SELECT name, document, api_version, spec, generation, created_ms, created_ms, agent_version "
        f"FROM environment_revisions{where}",
        args,
    )
    for r in await cur.fetchall():
        revisions.setdefault(r[0], {})[int(r[4])] = env_record(r)
    return {r[0]: ((env_record(r[:8]), revisions.get(r[0], {})), int(r[8])) for r in rows}


async def read_snapshot(conn: AsyncConnection[Any], keys: Iterable[Key] | None) -> Snapshot:
    """The rows of ``keys`` (None: every row) in one consistent snapshot."""
    wanted: dict[str, list[str] | None] = {k: None for k in ("node", "env", "token", "kv")}
    if keys is not None:
        wanted = {k: [] for k in wanted}
        for kind, name in keys:
            wanted[kind].append(name)  # type: ignore[union-attr]
    snap = Snapshot()
    async with conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        if wanted["node"] != []:
            snap.nodes = await read_nodes(conn, wanted["node"])
        if wanted["env"] != []:
            snap.envs = await read_envs(conn, wanted["env"])
        if wanted["token"] != []:
            where, args = _where("id", wanted["token"])
            cur = await conn.execute(f"SELECT {TOKEN_COLUMNS}, rev FROM tokens{where}", args)
            snap.tokens = {r[0]: (token_record(r[:11]), int(r[11])) for r in await cur.fetchall()}
        if wanted["kv"] != []:
            where, args = _where("key", wanted["kv"])
            cur = await conn.execute(f"SELECT key, value, rev FROM kv{where}", args)
            snap.kv = {r[0]: (bytes(r[1]), int(r[2])) for r in await cur.fetchall()}
    return snap
