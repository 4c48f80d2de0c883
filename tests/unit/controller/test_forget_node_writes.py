"""A name enrolling for the first time has no cluster marks to forget: the enrollment then costs
one store write, not three (issue 16's enrollment profile: two kv deletes per fresh enrollment)."""

from __future__ import annotations

import pytest

from tests.unit.controller.test_cluster import Cluster
from tether.controller.cluster.orchestrator import _key
from tether.controller.store import SqliteStore


def count_deletes(monkeypatch: pytest.MonkeyPatch, store: SqliteStore) -> list[str]:
    deleted: list[str] = []
    real = store.kv_delete

    async def spy(key: str) -> None:
        deleted.append(key)
        await real(key)

    monkeypatch.setattr(store, "kv_delete", spy)
    return deleted


async def test_a_name_never_seen_before_writes_nothing(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    deleted = count_deletes(monkeypatch, cluster.store)
    await cluster.orch.forget_node("c1", "fresh-1")
    assert deleted == []


async def test_a_reimaged_member_is_forgotten(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    for mark in ("labelled/w-1", "member/w-1", "member/w-2"):
        await cluster.store.kv_put(_key("c1", mark), b"1")
    deleted = count_deletes(monkeypatch, cluster.store)
    await cluster.orch.forget_node("c1", "w-1")
    assert sorted(deleted) == [_key("c1", "labelled/w-1"), _key("c1", "member/w-1")]
    assert cluster.store.kv_get(_key("c1", "member/w-1")) is None
    assert cluster.store.kv_get(_key("c1", "labelled/w-1")) is None
    assert cluster.store.kv_get(_key("c1", "member/w-2")) == b"1"  # another node's mark stays
