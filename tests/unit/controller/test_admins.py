"""Admin certificates: recorded when issued, revoked by name or fingerprint, refused once revoked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.controller.test_ca_auth import Ctx
from tether.controller import admins
from tether.controller.admins import AdminRegistry
from tether.controller.auth import Authenticator, Kind
from tether.controller.ca import CertificateAuthority
from tether.controller.errors import InvalidArgument, NotFound, Unauthenticated


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority.load_or_create(tmp_path / "pki")


def test_issue_record_revoke_by_name(tmp_path: Path, ca: CertificateAuthority) -> None:
    reg = AdminRegistry(tmp_path / "pki")
    _, bob1 = ca.issue_admin("bob", "admin")
    _, bob2 = ca.issue_admin("bob", "read-only")
    _, eve = ca.issue_admin("eve", "admin")
    for name, role, issued in (("bob", "admin", bob1), ("bob", "read-only", bob2), ("eve", "admin", eve)):
        reg.record(name, role, issued)
    assert (tmp_path / "pki" / "admins.json").stat().st_mode & 0o077 == 0
    revoked = reg.revoke(name="bob")
    assert {e.fingerprint for e in revoked} == {bob1.fingerprint, bob2.fingerprint}
    assert all(e.revoked_at for e in revoked)
    assert reg.is_revoked(bob1.fingerprint) and reg.is_revoked(bob2.fingerprint)
    assert not reg.is_revoked(eve.fingerprint)
    with pytest.raises(NotFound):
        reg.revoke(name="bob")  # nothing left to revoke
    assert [e.name for e in reg.entries() if not e.revoked] == ["eve"]


def test_revoke_by_fingerprint_prefix_and_unrecorded(tmp_path: Path, ca: CertificateAuthority) -> None:
    reg = AdminRegistry(tmp_path / "pki")
    _, a = ca.issue_admin("a", "admin")
    reg.record("a", "admin", a)
    with pytest.raises(InvalidArgument):
        reg.revoke(fingerprint=a.fingerprint[:6])  # too short to be safe
    with pytest.raises(InvalidArgument):
        reg.revoke(name="a", fingerprint=a.fingerprint)
    assert [e.name for e in reg.revoke(fingerprint=a.fingerprint[:12].upper())] == ["a"]
    with pytest.raises(NotFound):
        reg.revoke(fingerprint="ab" * 8)  # a prefix of nothing recorded
    _, old = ca.issue_admin("old", "admin")  # issued before the registry existed: never recorded
    assert reg.revoke(fingerprint=old.fingerprint)[0].name == "(unrecorded)"
    assert reg.is_revoked(old.fingerprint)


def test_authenticator_refuses_revoked_admins_even_when_cached(
    tmp_path: Path, ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admins, "RELOAD_SECONDS", 0.0)
    reg = AdminRegistry(tmp_path / "pki")
    _, bob = ca.issue_admin("bob", "admin")
    _, eve = ca.issue_admin("eve", "read-only")
    reg.record("bob", "admin", bob)
    reg.record("eve", "read-only", eve)
    auth = Authenticator(ca, revoked=reg.is_revoked)
    assert auth.principal(Ctx(bob.cert_pem)).kind is Kind.ADMIN  # now cached
    AdminRegistry(tmp_path / "pki").revoke(name="bob")  # another process (the CLI)
    os.utime(tmp_path / "pki" / "admins.json", ns=(1, 1))  # even within one mtime tick
    with pytest.raises(Unauthenticated, match="revoked"):
        auth.principal(Ctx(bob.cert_pem))
    assert auth.principal(Ctx(eve.cert_pem)).name == "eve"
