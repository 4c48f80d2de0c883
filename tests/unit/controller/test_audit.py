"""The audit log's bounds, masking and generations (issue 17, review of controller/audit.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from tether.controller import audit, wire
from tether.controller.admin_service import AdminService
from tether.controller.auth import Kind, Principal
from tether.controller.errors import PermissionDenied, StoreError
from tether.controller.store import SqliteStore
from tether.controller.store import base as store_base
from tether.controller.store.records import AuditRecord
from tether.nodeagent.secrets import Redactor

CI = Principal(Kind.ADMIN, "ci", "admin", fingerprint="f" * 64)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "tether.db")
    yield s
    await s.close()


def _record(i: int, outcome: str) -> AuditRecord:
    return AuditRecord(0, 1000 + i, "ro", "ab" * 32, "DeleteNode", "lab", "", 0, 0, outcome, f"n{i}")


async def test_refusals_are_bounded_apart_and_never_evict_a_change(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_base, "KEEP_AUDIT_RECORDS", 3)
    monkeypatch.setattr(store_base, "KEEP_AUDIT_REFUSALS", 2)
    changes = [(await store.append_audit(_record(i, "ok"))).id for i in range(3)]
    for i in range(50):  # a read-only admin spamming refused calls
        await store.append_audit(_record(10 + i, "PERMISSION_DENIED" if i % 2 else "NOT_FOUND"))
    kept = await store.list_audit()
    assert [r.id for r in kept if r.outcome == "ok"] == changes[::-1]  # every change is still there
    assert [r.detail for r in kept if r.outcome != "ok"] == ["n59", "n58"]  # the newest refusals
    newest = await store.append_audit(_record(99, "ok"))
    ids = [r.id for r in await store.list_audit() if r.outcome == "ok"]
    assert ids == [newest.id, changes[2], changes[1]]  # a change pushes out the oldest change only


SECRET_PASSWORD = "hunter2  secret\tpw"  # two spaces and a tab: collapsed, it would match no more
PEM = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "QyNTUxOQAAACBcanarycanarycanarycanarycanarycanarycanaryAAAAJDEADBEEF\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)


class _App:
    def __init__(self, store: SqliteStore) -> None:
        self.auth = SimpleNamespace(principal=lambda context: CI)
        self.store, self.redactor = store, Redactor()


class _Bootstrapping:
    def __init__(self, app: _App) -> None:
        self.app = app

    @audit.audited()
    async def Bootstrap(self, request: Any, context: Any) -> AsyncIterator[Any]:
        audit.note(environment=request.environment)
        key = request.ssh.private_key.decode()  # the record keeps the first line of a refusal only
        raise PermissionDenied(f"ssh login as root with {request.ssh.password} refused, key: {key}")
        yield None  # pragma: no cover - a stream that refuses at once


async def test_a_secret_with_tabs_spaces_or_lines_is_masked_before_the_detail_is_collapsed(
    store: SqliteStore,
) -> None:
    request = wire.admin.BootstrapRequest(environment="lab")
    request.ssh.password = SECRET_PASSWORD
    request.ssh.private_key = PEM.encode()
    with pytest.raises(PermissionDenied):
        async for _ in _Bootstrapping(_App(store)).Bootstrap(request, None):
            pass
    detail = (await store.list_audit())[0].detail
    assert detail == "ssh login as root with [REDACTED] refused, key: [REDACTED]"  # one line, collapsed
    # a line of a key alone (a message quoting one), and a password as !r quotes it (tab escaped)
    masked = audit._mask(Redactor(), request, f"key line {PEM.splitlines()[2]} not understood")
    assert masked == "key line [REDACTED] not understood"
    masked = audit._mask(Redactor(), request, f"login {SECRET_PASSWORD!r} refused")
    assert "hunter2" not in masked and "secret" not in masked


# -- generations and nodes as the methods note them (AdminService with a real store) -----------


def _document(command: str) -> str:
    return (
        "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata:\n  name: e\n"
        f"spec:\n  customTemplates:\n    - name: noop\n      inline: '{command}'\n"
    )


class _Aborted(Exception):
    pass


class _Context:
    async def abort_with_status(self, status: grpc.Status) -> None:
        raise _Aborted(status.details)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _Aborted(details)


def _service(store: SqliteStore, rollout_start: Any, delete_environment: Any = None) -> AdminService:
    app = SimpleNamespace(
        config=SimpleNamespace(max_document_bytes=1 << 20),
        auth=SimpleNamespace(principal=lambda context: CI),
        store=store,
        redactor=Redactor(),
        planner=SimpleNamespace(remember=lambda record, loaded: None),
        rollouts=SimpleNamespace(start=rollout_start),
    )
    agents = SimpleNamespace(resets=SimpleNamespace(delete_environment=delete_environment))
    return AdminService(app, agents)  # type: ignore[arg-type]


async def test_concurrent_applies_each_record_their_own_generations(store: SqliteStore) -> None:
    a_written, b_done = asyncio.Event(), asyncio.Event()

    async def start(record: Any, before: int) -> None:
        if record.document == _document("a"):  # A's write is done: B applies before A's call ends
            a_written.set()
            await b_done.wait()

    service = _service(store, start)
    apply = wire.admin.ApplyEnvironmentRequest
    first = await service.ApplyEnvironment(apply(document=_document("0")), _Context())
    a = asyncio.create_task(service.ApplyEnvironment(apply(document=_document("a")), _Context()))
    await a_written.wait()
    b = await service.ApplyEnvironment(apply(document=_document("b")), _Context())
    b_done.set()
    a_reply = await a
    generations = [first, a_reply, b]
    assert [g.environment.generation for g in generations] == [1, 2, 3]
    a_record, b_record, _ = await store.list_audit()  # newest first: B's call ended before A's
    assert (a_record.generation_before, a_record.generation_after) == (1, a_reply.environment.generation)
    assert (b_record.generation_before, b_record.generation_after) == (2, b.environment.generation)


async def test_a_delete_records_its_own_generations(store: SqliteStore) -> None:
    async def start(record: Any, before: int) -> None:
        return None

    async def delete_environment(name: str) -> None:
        await store.delete_environment(name)
        await service.ApplyEnvironment(  # another caller creates it again before the delete's call ends
            wire.admin.ApplyEnvironmentRequest(document=_document("again")), _Context()
        )

    service = _service(store, start, delete_environment)
    await service.ApplyEnvironment(wire.admin.ApplyEnvironmentRequest(document=_document("0")), _Context())
    await service.DeleteEnvironment(wire.admin.DeleteEnvironmentRequest(name="e"), _Context())
    deleted = next(r for r in await store.list_audit() if r.method == "DeleteEnvironment")
    assert (deleted.outcome, deleted.generation_before, deleted.generation_after) == ("ok", 1, 0)


async def test_a_token_for_a_node_records_the_node(store: SqliteStore) -> None:
    service = _service(store, None)
    with pytest.raises(_Aborted):
        await service.CreateToken(
            wire.admin.CreateTokenRequest(environment="missing", node_name="gpu-7"), _Context()
        )
    token = (await store.list_audit())[0]
    assert (token.method, token.outcome, token.environment, token.node) == (
        "CreateToken",
        "NOT_FOUND",
        "missing",
        "gpu-7",
    )


# -- the store away: the caller hears it at once, the record is tried in the background ---------


class _StoreDown:
    """A store whose writes fail with "store unavailable" once ``release`` is set (as PostgreSQL's
    wait for a connection does after 5 s)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.tried: list[AuditRecord] = []

    def get_environment(self, name: str) -> None:
        return None

    async def append_audit(self, record: AuditRecord) -> AuditRecord:
        self.tried.append(record)
        await self.release.wait()
        raise StoreError("store unavailable: cannot reach postgresql://db/tether")


class _Writing:
    def __init__(self, store: _StoreDown) -> None:
        self.app = SimpleNamespace(
            auth=SimpleNamespace(principal=lambda context: CI), store=store, redactor=Redactor()
        )

    @audit.audited()
    async def CreateToken(self, request: Any, context: Any) -> Any:
        raise StoreError("store unavailable: cannot reach postgresql://db/tether")


async def test_a_call_failed_by_the_store_does_not_wait_for_its_audit_record() -> None:
    store = _StoreDown()
    call = _Writing(store).CreateToken(wire.admin.CreateTokenRequest(environment="lab"), None)
    with pytest.raises(StoreError):  # answered while the record's write still waits for the store
        await asyncio.wait_for(call, timeout=5)
    assert [(r.method, r.outcome) for r in store.tried] == [("CreateToken", "UNAVAILABLE")]
    assert audit._background  # still trying
    store.release.set()
    while audit._background:
        await asyncio.sleep(0.01)
