"""Fixtures shared by the controller's unit tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.unit.controller.test_cluster import SPEC, Cluster
from tether.controller.store import SqliteStore


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """An orchestrator on a fresh SQLite store holding environment ``c1`` (test_cluster's SPEC)."""
    store = SqliteStore(tmp_path / "t.db")
    await store.put_environment("c1", SPEC, "holodeck.nvidia.com/v1alpha1", {})
    yield Cluster(store, tmp_path)
    await store.close()
