"""Issue 14 review: the DNS-name clash of a new environment names the other environment only to an
admin who may see it; to a scoped admin outside it, it is "another environment"."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from tether.controller import wire
from tether.controller.admin_service import AdminService
from tether.controller.auth import Kind, Principal
from tether.controller.store.records import EnvironmentRecord
from tether.nodeagent.secrets import Redactor

DOCUMENT = (
    "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata:\n  name: a-b\n"
    "spec:\n  kernel: {version: 6.8.0-1015-aws}\n"
)


class _Aborted(Exception):
    pass


class _Context:
    def __init__(self) -> None:
        self.status: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.status = (code, details)
        raise _Aborted(details)

    async def abort_with_status(self, status: grpc.Status) -> None:
        await self.abort(status.code, status.details)


def _refusal(principal: Principal) -> tuple[grpc.StatusCode, str]:
    existing = EnvironmentRecord("a_b", "", "v1alpha1", {}, 1, 0, 0)
    app = SimpleNamespace(
        config=SimpleNamespace(max_document_bytes=1 << 20),
        auth=SimpleNamespace(principal=lambda context: principal),
        store=SimpleNamespace(get_environment=lambda name: None, list_environments=lambda: [existing]),
    )
    service = AdminService(app, agents=None)  # type: ignore[arg-type]
    context = _Context()
    request = wire.admin.ApplyEnvironmentRequest(document=DOCUMENT, dry_run=True)

    async def apply() -> Any:
        return await service.ApplyEnvironment(request, context)

    with pytest.raises(_Aborted):
        asyncio.run(apply())
    assert context.status is not None
    return context.status


def test_an_admin_who_may_see_the_other_environment_is_told_its_name() -> None:
    for principal in (
        Principal(Kind.ADMIN, "root", "admin"),
        Principal(Kind.ADMIN, "ci", "admin", environments=frozenset({"a-b", "a_b"})),
    ):
        code, details = _refusal(principal)
        assert code == grpc.StatusCode.ALREADY_EXISTS
        assert "would have the DNS name 'a-b', which environment 'a_b' already has" in details


def test_a_scoped_admin_outside_the_other_environment_is_not_told_its_name() -> None:
    code, details = _refusal(Principal(Kind.ADMIN, "ci", "admin", environments=frozenset({"a-b"})))
    assert code == grpc.StatusCode.ALREADY_EXISTS
    assert "would have the DNS name 'a-b', which another environment already has" in details
    assert "a_b" not in details


class _SlowStore:
    """A store whose write takes a while: two applies of clashing new names overlap in it."""

    def __init__(self) -> None:
        self.envs: dict[str, EnvironmentRecord] = {}
        self.kv: dict[str, bytes] = {}

    def kv_get(self, key: str) -> bytes | None:
        return self.kv.get(key)

    async def kv_put(self, key: str, value: bytes) -> None:
        self.kv[key] = value

    async def kv_put_if_absent(self, key: str, value: bytes) -> bytes:
        await asyncio.sleep(0)  # the store's round trip: other applies run meanwhile
        return self.kv.setdefault(key, value)

    def get_environment(self, name: str) -> EnvironmentRecord | None:
        return self.envs.get(name)

    def list_environments(self) -> list[EnvironmentRecord]:
        return list(self.envs.values())

    def list_nodes(self, name: str) -> list[Any]:
        return []

    async def append_audit(self, record: Any) -> Any:
        return record

    async def put_environment(self, name: str, document: str, *args: Any, **kw: Any) -> Any:
        await asyncio.sleep(0.05)
        self.envs[name] = EnvironmentRecord(name, document, "v1alpha1", {}, 1, 0, 0)
        return self.envs[name], True


def _service(store: _SlowStore) -> AdminService:
    admin = Principal(Kind.ADMIN, "root", "admin")

    async def noop(*args: Any, **kw: Any) -> None:
        return None

    app = SimpleNamespace(
        config=SimpleNamespace(max_document_bytes=1 << 20),
        auth=SimpleNamespace(principal=lambda context: admin),
        store=store,
        planner=SimpleNamespace(remember=lambda record, loaded: None),
        rollouts=SimpleNamespace(start=noop),
        redactor=Redactor(),
    )
    return AdminService(app, agents=None)  # type: ignore[arg-type]


async def _apply(service: AdminService, name: str) -> str:
    request = wire.admin.ApplyEnvironmentRequest(document=DOCUMENT.replace("a-b", name))
    try:
        await service.ApplyEnvironment(request, _Context())
    except _Aborted:
        return "refused"
    return "applied"


def test_clashing_new_names_applied_through_two_replicas_cannot_both_succeed() -> None:
    """Issue 13: replicas sharing a store each have their own lock; the DNS name is claimed in
    the store, so of two replicas creating ``a-b`` and ``a_b`` at once, one wins."""
    store = _SlowStore()
    one, other = _service(store), _service(store)

    async def both() -> list[str]:
        return list(await asyncio.gather(_apply(one, "a-b"), _apply(other, "a_b")))

    assert sorted(asyncio.run(both())) == ["applied", "refused"]
    assert len(store.envs) == 1


def test_a_failed_write_frees_the_claimed_name() -> None:
    store = _SlowStore()
    service = _service(store)

    async def failing(*args: Any, **kw: Any) -> Any:
        raise RuntimeError("the database went away")

    store.put_environment = failing  # type: ignore[method-assign]
    assert asyncio.run(_apply(service, "a-b")) == "refused"  # INTERNAL
    del store.put_environment
    assert asyncio.run(_apply(_service(store), "a_b")) == "applied"


def test_two_concurrent_applies_of_clashing_new_names_cannot_both_succeed() -> None:
    store = _SlowStore()
    admin = Principal(Kind.ADMIN, "root", "admin")

    async def noop(*args: Any, **kw: Any) -> None:
        return None

    app = SimpleNamespace(
        config=SimpleNamespace(max_document_bytes=1 << 20),
        auth=SimpleNamespace(principal=lambda context: admin),
        store=store,
        planner=SimpleNamespace(remember=lambda record, loaded: None),
        rollouts=SimpleNamespace(start=noop),
        redactor=Redactor(),
    )
    service = AdminService(app, agents=None)  # type: ignore[arg-type]

    async def apply(name: str) -> str:
        request = wire.admin.ApplyEnvironmentRequest(document=DOCUMENT.replace("a-b", name))
        try:
            await service.ApplyEnvironment(request, _Context())
        except _Aborted:
            return "refused"
        return "applied"

    async def both() -> list[str]:
        return list(await asyncio.gather(apply("a-b"), apply("a_b")))

    assert sorted(asyncio.run(both())) == ["applied", "refused"]
    assert len(store.envs) == 1
