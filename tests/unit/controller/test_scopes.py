"""Scoped admin certificates (CA, registry, authenticator) and the audit log's store and masking."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from tests.unit.controller.test_ca_auth import Ctx
from tether.controller import admins, audit, wire
from tether.controller.admins import AdminRegistry, parse_environments
from tether.controller.auth import Authenticator, Kind, Principal
from tether.controller.ca import ADMIN_SCOPE_URI_PREFIX, ADMIN_URI_PREFIX, CertificateAuthority
from tether.controller.errors import InvalidArgument, PermissionDenied, Problem, Unauthenticated
from tether.controller.store import SqliteStore
from tether.controller.store import sqlite as sqlite_store
from tether.controller.store.records import AuditRecord
from tether.nodeagent.secrets import Redactor


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority.load_or_create(tmp_path / "pki")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "tether.db")
    yield s
    await s.close()


def _uris(pem: bytes) -> list[str]:
    cert = x509.load_pem_x509_certificate(pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return list(san.get_values_for_type(x509.UniformResourceIdentifier))


def test_the_certificate_names_its_environments_and_the_principal_carries_them(
    ca: CertificateAuthority,
) -> None:
    _, issued = ca.issue_admin("ci", "admin", environments=["staging", "gpu-lab", "staging"])
    assert _uris(issued.cert_pem) == [
        f"{ADMIN_URI_PREFIX}admin/ci",
        f"{ADMIN_SCOPE_URI_PREFIX}gpu-lab",
        f"{ADMIN_SCOPE_URI_PREFIX}staging",
    ]
    p = Authenticator(ca).principal(Ctx(issued.cert_pem))
    assert (p.kind, p.name, p.role, p.environments) == (Kind.ADMIN, "ci", "admin", {"gpu-lab", "staging"})
    _, everything = ca.issue_admin("root", "admin")
    assert _uris(everything.cert_pem) == [f"{ADMIN_URI_PREFIX}admin/root"]
    assert Authenticator(ca).principal(Ctx(everything.cert_pem)).environments == frozenset()


def test_may_see_and_require_environment() -> None:
    ci = Principal(Kind.ADMIN, "ci", "admin", environments=frozenset({"gpu-lab", "staging"}))
    assert ci.may_see("gpu-lab") and not ci.may_see("prod") and not ci.may_see("")
    with pytest.raises(PermissionDenied, match="admin 'ci' may not use environment 'prod'"):
        ci.require_environment("prod")
    with pytest.raises(PermissionDenied):
        ci.require_unscoped("this")
    root = Principal(Kind.ADMIN, "root", "admin")
    assert root.may_see("prod") and root.may_see("")
    root.require_environment("prod")
    root.require_unscoped("this")


def test_environment_lists_are_checked(tmp_path: Path, ca: CertificateAuthority) -> None:
    assert parse_environments(" staging,gpu-lab,,staging ") == ["gpu-lab", "staging"]
    assert parse_environments("") == []
    for bad in ("a/b", "x" * 254, "-a", "a b", "a:b"):
        with pytest.raises(InvalidArgument):
            parse_environments(bad)
    assert parse_environments("Prod,aws_kubeadm_example") == ["Prod", "aws_kubeadm_example"]  # holodeck's
    with pytest.raises(InvalidArgument):
        ca.issue_admin("ci", "admin", environments=["a/b"])


def test_the_registry_records_the_scope_and_is_authoritative(
    tmp_path: Path, ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admins, "RELOAD_SECONDS", 0.0)
    reg = AdminRegistry(tmp_path / "pki")
    _, ci = ca.issue_admin("ci", "admin", environments=["lab"])
    entry = reg.record("ci", "admin", ci, ["lab"])
    assert entry.environments == ["lab"] and reg.scope_of(ci.fingerprint) == {"lab"}
    auth = Authenticator(ca, revoked=reg.is_revoked, scope=reg.scope_of)
    assert auth.principal(Ctx(ci.cert_pem)).environments == {"lab"}

    _, old = ca.issue_admin("old", "admin", environments=["lab"])  # never recorded: its own scope holds
    assert reg.scope_of(old.fingerprint) is None
    assert auth.principal(Ctx(old.cert_pem)).environments == {"lab"}

    path = tmp_path / "pki" / "admins.json"
    doc = json.loads(path.read_text())
    doc["admins"][0]["environments"] = ["lab", "prod"]  # widened by hand: the certificate disagrees
    path.write_text(json.dumps(doc))
    with pytest.raises(PermissionDenied, match="recorded"):
        auth.principal(Ctx(ci.cert_pem))  # even though the principal is cached


def test_a_registry_that_records_every_certificate_refuses_one_it_has_no_record_of(
    ca: CertificateAuthority,
) -> None:
    """The identity kept in the store: its CA was made with the registry, so an admin certificate
    without a record lost it (deleted in the database to undo a revocation, say)."""
    _, kept = ca.issue_admin("kept", "admin")
    _, lost = ca.issue_admin("lost", "admin")
    recorded = {kept.fingerprint: frozenset[str]()}
    auth = Authenticator(ca, scope=recorded.get, recorded_only=True)
    assert auth.principal(Ctx(kept.cert_pem)).name == "kept"
    with pytest.raises(Unauthenticated, match="not in the controller's admin registry"):
        auth.principal(Ctx(lost.cert_pem))
    assert Authenticator(ca, scope=recorded.get).principal(Ctx(lost.cert_pem)).name == "lost"  # files: legacy


def test_a_registry_written_before_scopes_reads_as_unscoped(tmp_path: Path, ca: CertificateAuthority) -> None:
    (tmp_path / "pki").mkdir(exist_ok=True)
    _, bob = ca.issue_admin("bob", "admin")
    entry = {"fingerprint": bob.fingerprint, "name": "bob", "role": "admin", "serial": "1"}
    entry |= {"not_after": "2099-01-01T00:00:00+00:00", "issued_at": "2024-01-01T00:00:00+00:00"}
    (tmp_path / "pki" / "admins.json").write_text(json.dumps({"admins": [entry]}))
    reg = AdminRegistry(tmp_path / "pki")
    assert reg.entries()[0].environments == [] and reg.scope_of(bob.fingerprint) == frozenset()
    auth = Authenticator(ca, revoked=reg.is_revoked, scope=reg.scope_of)
    assert auth.principal(Ctx(bob.cert_pem)).environments == frozenset()


def _record(i: int, environment: str) -> AuditRecord:
    return AuditRecord(0, 1000 + i, "ci", "ab" * 32, "CreateToken", environment, "", 0, 0, "ok", f"n{i}")


def test_a_refusal_is_one_line_and_a_refused_document_is_never_quoted() -> None:
    apply = wire.admin.ApplyEnvironmentRequest(document="spec: {password: hunter2hunter2}")
    exc = InvalidArgument(
        "bad",
        [Problem("spec.kernel.version", "'hunter2hunter2' is no version"), Problem("metadata.name", "x")],
    )
    assert audit._refusal(exc, apply) == "document refused, 2 problem(s): metadata.name, spec.kernel.version"
    create = wire.admin.CreateTokenRequest(environment="lab")
    assert audit._refusal(PermissionDenied("no\nmore"), create) == "no"
    assert (
        audit._refusal(InvalidArgument("ttl must be at most 365 days"), create)
        == "ttl must be at most 365 days"
    )


def test_details_are_masked_and_cut() -> None:
    token = "abcdef." + "k" * 32
    revoke = wire.admin.RevokeTokenRequest(id=token)
    masked = audit._mask(Redactor(), revoke, f"token {token!r} not found")
    assert "k" * 32 not in masked
    bootstrap = wire.admin.BootstrapRequest(environment="lab")
    bootstrap.ssh.password = "correct-horse-battery"
    assert "correct-horse-battery" not in audit._mask(
        Redactor(), bootstrap, "login correct-horse-battery refused"
    )
    assert len(audit._mask(Redactor(), revoke, "x" * 5000)) == audit.MAX_DETAIL_CHARS


class _Auth:
    def __init__(self, principal: Principal) -> None:
        self.p = principal

    def principal(self, context: Any) -> Principal:
        return self.p


class _App:
    def __init__(self, principal: Principal, store: SqliteStore) -> None:
        self.auth, self.store, self.redactor = _Auth(principal), store, Redactor()


audited_ok = audit.audited(describe=lambda q, r: "revoked")


class _Service:
    def __init__(self, app: _App) -> None:
        self.app = app

    @audited_ok
    async def RevokeNode(self, request: Any, context: Any) -> Any:
        audit.note(node=request.name, environment="lab")
        if request.name == "missing":
            raise PermissionDenied("admin 'ci' may not use node 'missing'")
        return wire.admin.RevokeNodeResponse()


async def test_the_decorator_records_success_and_refusal_once_each(store: SqliteStore) -> None:
    ci = Principal(Kind.ADMIN, "ci", "admin", fingerprint="f" * 64, environments=frozenset({"lab"}))
    service = _Service(_App(ci, store))
    await service.RevokeNode(wire.admin.RevokeNodeRequest(name="n1"), None)
    with pytest.raises(PermissionDenied):
        await service.RevokeNode(wire.admin.RevokeNodeRequest(name="missing"), None)
    audit.note(node="outside any call")  # nothing to record it in: ignored
    refused, ok = await store.list_audit()
    assert (ok.admin, ok.fingerprint, ok.method, ok.node, ok.environment) == (
        "ci",
        "f" * 64,
        "RevokeNode",
        "n1",
        "lab",
    )
    assert (ok.outcome, ok.detail) == ("ok", "revoked")
    assert (refused.outcome, refused.node, refused.detail) == (
        "PERMISSION_DENIED",
        "missing",
        "admin 'ci' may not use node 'missing'",
    )


async def test_calls_by_non_admins_are_not_recorded(store: SqliteStore) -> None:
    service = _Service(_App(Principal(Kind.ANONYMOUS, "anonymous"), store))
    await service.RevokeNode(wire.admin.RevokeNodeRequest(name="n1"), None)
    assert await store.list_audit() == []


async def test_a_schema_3_database_gains_the_audit_log(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    await SqliteStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE audit")
        conn.execute("UPDATE meta SET value='3' WHERE key='schema_version'")
    store = SqliteStore(path)
    try:
        assert (await store.append_audit(_record(0, "lab"))).id == 1
        assert (await store.list_audit("lab"))[0].detail == "n0"
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (
            str(sqlite_store.SCHEMA_VERSION),
        )


class _Streaming:
    def __init__(self, app: _App) -> None:
        self.app = app

    @audit.audited(describe=lambda q, last: f"{last.target}: {last.outcome}")
    async def Bootstrap(self, request: Any, context: Any) -> AsyncIterator[Any]:
        audit.note(environment=request.environment)
        yield wire.admin.BootstrapEvent(step="connect", target="root@10.0.0.5:22")
        audit.note(node="gpu-1")  # known once the machine answered
        yield wire.admin.BootstrapEvent(step="done", target="root@10.0.0.5:22", outcome="installed")


async def test_a_stream_is_recorded_when_it_ends_or_is_abandoned(store: SqliteStore) -> None:
    ci = Principal(Kind.ADMIN, "ci", "admin", fingerprint="f" * 64)
    service = _Streaming(_App(ci, store))
    request = wire.admin.BootstrapRequest(environment="lab")
    assert [e.step async for e in service.Bootstrap(request, None)] == ["connect", "done"]
    stream = service.Bootstrap(request, None)
    await stream.__anext__()
    await stream.aclose()  # the client went away after the first event
    abandoned, done = await store.list_audit()
    assert (done.outcome, done.node, done.environment, done.detail) == (
        "ok",
        "gpu-1",
        "lab",
        "root@10.0.0.5:22: installed",
    )
    assert (abandoned.outcome, abandoned.node) == ("CANCELLED", "")
