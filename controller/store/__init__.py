"""The controller's state: one interface (``Store``), two backends.

``open_store("postgresql://...")`` gives the replicated PostgreSQL store (``PostgresStore``);
any other location is a SQLite file (``SqliteStore``, the embedded default). docs/store.md.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tether.controller.store.base import Store
from tether.controller.store.migrations import is_postgres_url
from tether.controller.store.records import EnvironmentRecord, NodeRecord, StepRecord, StoreChange
from tether.controller.store.sqlite import SqliteStore


async def open_store(
    location: str | Path,
    observe_commit: Callable[[float, int], None] | None = None,
    *,
    notify_key: bytes | None = None,
    **options: int,
) -> Store:
    """The store at ``location``: a ``postgresql://USER@HOST:PORT/DB`` URL, or a SQLite file path.
    Migrations are applied on the way (under a lock); StoreError says why it cannot be opened.
    ``notify_key`` (PostgreSQL: required): the key of ``--store-key-file``, which signs the notices
    between replicas (SQLite ignores it). ``options`` (PostgreSQL only): min_connections,
    max_connections of its pool."""
    if isinstance(location, str) and is_postgres_url(location):
        from tether.controller.store.postgres import PostgresStore  # psycopg only when used

        return await PostgresStore.open(
            location, observe_commit=observe_commit, notify_key=notify_key, **options
        )
    return SqliteStore(Path(location), observe_commit=observe_commit)


__all__ = [
    "EnvironmentRecord",
    "NodeRecord",
    "SqliteStore",
    "StepRecord",
    "Store",
    "StoreChange",
    "is_postgres_url",
    "open_store",
]
