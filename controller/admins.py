"""Admin certificates this controller issued, and the ones revoked: ``DATA_DIR/pki/admins.json``.

``tether-controller admin issue`` records every certificate it signs (so does the first start,
for ``admin.conf``); ``tether-controller admin revoke`` marks one revoked. The running
controller re-reads the file when it changes (looked at no more than once a second) and
refuses a revoked certificate on the next call it makes. The file holds fingerprints, names,
roles, scopes and dates, never a key.

A certificate's scope (``admin issue --environments a,b``: the environments it may use; none
recorded: every one) is recorded here too, and this record is what the controller enforces: a
certificate whose own list of environments differs from its record is refused (see
``tether.controller.auth``). A scope is not changed in place: issue a new certificate, revoke the old.

With ``--store-key-file`` the same records live in the store instead, sealed, shared by every
replica (``tether.controller.identity.admins.StoreAdmins``, built on ``new_entry`` and
``mark_revoked`` below).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tether.controller.ca import IssuedCert
from tether.controller.errors import InvalidArgument, NotFound

FILE_NAME = "admins.json"
RELOAD_SECONDS = 1.0
MIN_PREFIX = 12


@dataclass(frozen=True)
class AdminEntry:
    fingerprint: str  # sha256 hex of the DER certificate
    name: str
    role: str
    serial: str  # hex
    not_after: str  # ISO 8601, UTC
    issued_at: str
    revoked_at: str = ""
    environments: list[str] = field(default_factory=list)  # its scope; empty: every environment

    @property
    def revoked(self) -> bool:
        return bool(self.revoked_at)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def parse_environments(text: str) -> list[str]:
    """``gpu-lab,staging`` as a sorted list of environment names (each checked); "" -> []."""
    from tether.controller.spec.names import HOLODECK_NAME_RULE, is_environment_name  # the rules

    names = sorted({n.strip() for n in text.split(",") if n.strip()})
    bad = [n for n in names if not is_environment_name(n)]
    if bad:
        raise InvalidArgument(f"{bad[0]!r} is not an environment name ({HOLODECK_NAME_RULE})")
    return names


def new_entry(name: str, role: str, issued: IssuedCert, environments: Iterable[str] = ()) -> AdminEntry:
    """The record of a certificate just issued."""
    not_after = dt.datetime.fromtimestamp(issued.not_after_ms / 1000, dt.timezone.utc)
    return AdminEntry(
        fingerprint=issued.fingerprint,
        name=name,
        role=role,
        serial=f"{issued.serial:x}",
        not_after=not_after.replace(microsecond=0).isoformat(),
        issued_at=_now(),
        environments=sorted(set(environments)),
    )


def revocation_prefix(*, name: str = "", fingerprint: str = "") -> str:
    """Check what a revocation names (exactly one of the two); the fingerprint prefix, normalised."""
    if bool(name) == bool(fingerprint):
        raise InvalidArgument("give exactly one of --name or --fingerprint")
    fp = fingerprint.strip().lower().replace(":", "")
    if fingerprint and (len(fp) < MIN_PREFIX or any(c not in "0123456789abcdef" for c in fp)):
        raise InvalidArgument(f"a fingerprint is hex, at least {MIN_PREFIX} digits (see: admin list)")
    return fp


def mark_revoked(entries: list[AdminEntry], *, name: str = "", fingerprint: str = "") -> list[AdminEntry]:
    """Mark revoked, in ``entries``, what ``AdminRegistry.revoke`` names (an unrecorded full
    fingerprint is appended); returns the entries it names, revoked."""
    fp = revocation_prefix(name=name, fingerprint=fingerprint)
    if name:
        hits = [i for i, e in enumerate(entries) if e.name == name and not e.revoked]
        if not hits:
            raise NotFound(f"no unrevoked admin certificate issued to {name!r}")
    else:
        hits = [i for i, e in enumerate(entries) if e.fingerprint.startswith(fp)]
        if len({entries[i].fingerprint for i in hits}) > 1:
            raise InvalidArgument(f"fingerprint prefix {fp!r} matches several certificates")
        if not hits:
            if len(fp) != 64:
                raise NotFound(f"no admin certificate with fingerprint {fp}... (see: admin list)")
            entries.append(AdminEntry(fp, "(unrecorded)", "", "", "", ""))
            hits = [len(entries) - 1]
    when = _now()
    for i in hits:
        if not entries[i].revoked:
            entries[i] = replace(entries[i], revoked_at=when)
    return [entries[i] for i in hits]


class AdminRegistry:
    def __init__(self, pki_dir: Path) -> None:
        self.path = pki_dir / FILE_NAME
        self._revoked: frozenset[str] = frozenset()
        self._scopes: dict[str, frozenset[str]] = {}
        self._stamp: tuple[int, int] | None = None
        self._checked = float("-inf")

    # -- writers (the tether-controller admin CLI, and the first start) --------------------------

    def record(
        self, name: str, role: str, issued: IssuedCert, environments: Iterable[str] = ()
    ) -> AdminEntry:
        entry = new_entry(name, role, issued, environments)
        with self._locked() as entries:
            entries.append(entry)
        return entry

    def revoke(self, *, name: str = "", fingerprint: str = "") -> list[AdminEntry]:
        """Revoke every live certificate issued to ``name``, or the one ``fingerprint`` names.

        A fingerprint may be shortened to a unique prefix of at least 12 hex digits; a full one
        that was never recorded here (issued before this file existed) is revoked all the same.
        """
        revocation_prefix(name=name, fingerprint=fingerprint)  # before anything is created
        with self._locked() as entries:
            return mark_revoked(entries, name=name, fingerprint=fingerprint)

    # -- readers ------------------------------------------------------------------------------

    def entries(self) -> list[AdminEntry]:
        return self._read()

    def is_revoked(self, fingerprint: str) -> bool:
        """For every admin call: cheap, and no older than RELOAD_SECONDS."""
        self._refresh()
        return fingerprint in self._revoked

    def scope_of(self, fingerprint: str) -> frozenset[str] | None:
        """The environments recorded for a certificate (empty: every one); None: never recorded.
        For every admin call, like ``is_revoked``."""
        self._refresh()
        return self._scopes.get(fingerprint)

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked < RELOAD_SECONDS:
            return
        self._checked = now
        try:
            st = self.path.stat()
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp != self._stamp:
            entries = self._read()
            self._revoked = frozenset(e.fingerprint for e in entries if e.revoked)
            self._scopes = {e.fingerprint: frozenset(e.environments) for e in entries}
            self._stamp = stamp

    def _read(self) -> list[AdminEntry]:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except ValueError as exc:
            raise InvalidArgument(f"{self.path} is not valid JSON: {exc}") from exc
        return [AdminEntry(**e) for e in doc.get("admins", [])]

    @contextlib.contextmanager
    def _locked(self) -> Iterator[list[AdminEntry]]:
        """Read, let the caller change, write back atomically (0600), under an exclusive lock."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = self._read()
            yield entries
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"admins": [asdict(e) for e in entries]}, f, indent=2)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        finally:
            os.close(lock)
