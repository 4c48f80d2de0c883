"""Measure the two asyncio PostgreSQL drivers on the store's own kinds of statements (docs/store.md).

Run: .venv/bin/python scripts/pg_drivers.py  (needs asyncpg installed and the PostgreSQL binaries;
it makes its own scratch cluster and removes it).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "proto"))  # the tether package

ROWS = 20_000  # rows inserted, in batches
BATCH = 100
LOOKUPS = 5_000  # single-row selects, one after another
TASKS = 16  # concurrent small transactions (select + update + commit)
TXNS = 4_000
DDL = "CREATE TABLE t (node text, seq bigint, body text, PRIMARY KEY (node, seq))"
BODY = "x" * 400


async def _timed(label: str, n: int, fn: Callable[[], Awaitable[None]]) -> tuple[str, float]:
    t0 = time.perf_counter()
    await fn()
    return label, n / (time.perf_counter() - t0)


async def psycopg_run(url: str) -> list[tuple[str, float]]:
    import psycopg
    from psycopg_pool import AsyncConnectionPool

    async with AsyncConnectionPool(url, min_size=TASKS, max_size=TASKS, open=False) as pool:
        await pool.open(wait=True)
        async with pool.connection() as c:
            await c.execute("DROP TABLE IF EXISTS t")
            await c.execute(DDL)

        async def insert() -> None:
            async with pool.connection() as c:
                for b in range(ROWS // BATCH):
                    async with c.transaction(), c.cursor() as cur:
                        rows = [("n", b * BATCH + i, BODY) for i in range(BATCH)]
                        await cur.executemany("INSERT INTO t VALUES (%s, %s, %s)", rows)

        async def copy() -> None:
            async with pool.connection() as c:
                await c.execute("TRUNCATE t")
                for b in range(ROWS // BATCH):
                    async with (
                        c.transaction(),
                        c.cursor() as cur,
                        cur.copy("COPY t (node, seq, body) FROM STDIN") as cp,
                    ):
                        for i in range(BATCH):
                            await cp.write_row(("n", b * BATCH + i, BODY))

        async def lookups() -> None:
            async with pool.connection() as c:
                for i in range(LOOKUPS):
                    await (
                        await c.execute("SELECT body FROM t WHERE node=%s AND seq=%s", ("n", i))
                    ).fetchone()

        async def txns() -> None:
            async def one(k: int) -> None:
                for i in range(TXNS // TASKS):
                    async with pool.connection() as c, c.transaction():
                        await c.execute("SELECT body FROM t WHERE node=%s AND seq=%s FOR UPDATE", ("n", k))
                        await c.execute("UPDATE t SET body=%s WHERE node=%s AND seq=%s", (str(i), "n", k))

            await asyncio.gather(*(one(k) for k in range(TASKS)))

        _ = psycopg
        return [
            await _timed("insert rows/s (executemany, 100 a transaction)", ROWS, insert),
            await _timed("insert rows/s (COPY, 100 a transaction)", ROWS, copy),
            await _timed("select by key/s (one connection)", LOOKUPS, lookups),
            await _timed("transactions/s (16 tasks, pool)", TXNS, txns),
        ]


async def asyncpg_run(url: str) -> list[tuple[str, float]]:
    import asyncpg

    pool: Any = await asyncpg.create_pool(url, min_size=TASKS, max_size=TASKS)
    try:
        async with pool.acquire() as c:
            await c.execute("DROP TABLE IF EXISTS t")
            await c.execute(DDL)

        async def insert() -> None:
            async with pool.acquire() as c:
                for b in range(ROWS // BATCH):
                    async with c.transaction():
                        rows = [("n", b * BATCH + i, BODY) for i in range(BATCH)]
                        await c.executemany("INSERT INTO t VALUES ($1, $2, $3)", rows)

        async def copy() -> None:
            async with pool.acquire() as c:
                await c.execute("TRUNCATE t")
                for b in range(ROWS // BATCH):
                    async with c.transaction():
                        rows = [("n", b * BATCH + i, BODY) for i in range(BATCH)]
                        await c.copy_records_to_table("t", records=rows, columns=["node", "seq", "body"])

        async def lookups() -> None:
            async with pool.acquire() as c:
                for i in range(LOOKUPS):
                    await c.fetchrow("SELECT body FROM t WHERE node=$1 AND seq=$2", "n", i)

        async def txns() -> None:
            async def one(k: int) -> None:
                for i in range(TXNS // TASKS):
                    async with pool.acquire() as c, c.transaction():
                        await c.fetchrow("SELECT body FROM t WHERE node=$1 AND seq=$2 FOR UPDATE", "n", k)
                        await c.execute("UPDATE t SET body=$1 WHERE node=$2 AND seq=$3", str(i), "n", k)

            await asyncio.gather(*(one(k) for k in range(TASKS)))

        return [
            await _timed("insert rows/s (executemany, 100 a transaction)", ROWS, insert),
            await _timed("insert rows/s (COPY, 100 a transaction)", ROWS, copy),
            await _timed("select by key/s (one connection)", LOOKUPS, lookups),
            await _timed("transactions/s (16 tasks, pool)", TXNS, txns),
        ]
    finally:
        await pool.close()


def main() -> None:
    from tests import pgscratch

    cluster = pgscratch.start_cluster()
    try:
        url = cluster.create_database("drivers")
        for name, run in (("psycopg", psycopg_run), ("asyncpg", asyncpg_run)) * 2:  # twice: warm
            for label, rate in asyncio.run(run(url)):
                print(f"{name:8} {label:50} {rate:10.0f}")
    finally:
        cluster.remove()


if __name__ == "__main__":
    main()
