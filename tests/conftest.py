"""Every tier: the repository's folders are importable only as ``tether.*``.

pytest puts the repository root on ``sys.path``, which would let a stray ``import bootstrap`` or
``resources.files("nodeagent")`` find the folder under its old top-level name and pass here while
the installed package (which has only ``tether``) fails. This finder refuses those names.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

import pytest

from tests import pgscratch
from tests.pgscratch import ScratchCluster

OLD_NAMES = frozenset({"controller", "nodeagent", "bootstrap"})


class _OnlyTether:
    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name.split(".")[0] in OLD_NAMES:
            raise ModuleNotFoundError(f"No module named {name!r} (use tether.{name})", name=name)
        return None


sys.meta_path.insert(0, _OnlyTether())


# -- PostgreSQL: a private scratch cluster per test session (tests/pgscratch.py) -------------------


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[ScratchCluster]:
    """A running scratch cluster for this session, removed at its end (also on failure); skips
    only when PostgreSQL is not installed (scripts/system-deps installs it)."""
    if pgscratch.find_bin() is None:
        pytest.skip(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): run scripts/system-deps"
        )
    cluster = pgscratch.start_cluster()
    try:
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture(scope="session")
def pg_url(pg_cluster: ScratchCluster) -> str:
    """The scratch cluster's administrative URL (database ``postgres``)."""
    return pg_cluster.url


@pytest.fixture
def pg_database(pg_cluster: ScratchCluster) -> Iterator[str]:
    """A fresh empty database on the scratch cluster for one test; its URL."""
    if not pg_cluster.running():  # a fault test left it down
        pg_cluster.start()
    url = pg_cluster.create_database()
    yield url
    if pg_cluster.running():
        pg_cluster.drop_database(url)
