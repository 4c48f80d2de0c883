"""The admin registry behind one interface (``Admins``), kept in files or in the store.

``FileAdmins``: today's ``DATA_DIR/pki/admins.json`` (``tether.controller.admins``).
``StoreAdmins``: one record per certificate under ``identity/admins/<fingerprint>`` in the store's
key/value table, each sealed with the key-encryption key (the kv key bound in, so records cannot be
swapped; a database writer cannot forge or widen one). Every replica reads them from its store: a
change another replica makes (``Store.subscribe``, kind "kv") is seen on the next call, and the
records are read again at least once a second anyway (the admin CLI's writes on SQLite). A record
that does not decrypt counts as revoked, and so does a certificate without a record: the CA was
made in the store with the registry, so every admin certificate it signed was recorded, and a
database writer who deletes a revoked one's record must not bring it back.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from dataclasses import asdict
from typing import Protocol

from cryptography.exceptions import InvalidTag

from tether.controller import admins
from tether.controller.admins import AdminEntry, AdminRegistry, mark_revoked, new_entry, revocation_prefix
from tether.controller.ca import IssuedCert
from tether.controller.secretbox import SecretBox
from tether.controller.store.base import Store
from tether.controller.store.records import StoreChange
from tether.nodeagent import logs

log = logs.get_logger("tether.controller.identity")

PREFIX = "identity/admins/"
UNREADABLE = "(unreadable record)"


class Admins(Protocol):
    """Admin certificates issued, and which are revoked: readers for every call, async writers."""

    # True: a certificate this registry has no record of is refused (see ``Authenticator``).
    every_certificate_recorded: bool

    def is_revoked(self, fingerprint: str) -> bool: ...
    def scope_of(self, fingerprint: str) -> frozenset[str] | None: ...
    def entries(self) -> list[AdminEntry]: ...
    async def record(
        self, name: str, role: str, issued: IssuedCert, environments: Iterable[str] = ()
    ) -> AdminEntry: ...
    async def revoke(self, *, name: str = "", fingerprint: str = "") -> list[AdminEntry]: ...


class FileAdmins:
    """``AdminRegistry`` (``pki/admins.json``) as ``Admins``: its writes (under flock) in a thread."""

    every_certificate_recorded = False  # certificates issued before admins.json existed are valid

    def __init__(self, registry: AdminRegistry) -> None:
        self.registry = registry

    def __repr__(self) -> str:
        return f"FileAdmins({str(self.registry.path)!r})"

    def is_revoked(self, fingerprint: str) -> bool:
        return self.registry.is_revoked(fingerprint)

    def scope_of(self, fingerprint: str) -> frozenset[str] | None:
        return self.registry.scope_of(fingerprint)

    def entries(self) -> list[AdminEntry]:
        return self.registry.entries()

    async def record(
        self, name: str, role: str, issued: IssuedCert, environments: Iterable[str] = ()
    ) -> AdminEntry:
        return await asyncio.to_thread(self.registry.record, name, role, issued, list(environments))

    async def revoke(self, *, name: str = "", fingerprint: str = "") -> list[AdminEntry]:
        return await asyncio.to_thread(lambda: self.registry.revoke(name=name, fingerprint=fingerprint))


class StoreAdmins:
    """The registry in the store's kv, sealed with the key-encryption key."""

    every_certificate_recorded = True

    def __init__(self, store: Store, kek: SecretBox) -> None:
        self._store = store
        self._kek = kek
        self._cache: dict[str, tuple[bytes, AdminEntry | None]] = {}  # kv key -> (blob, entry)
        self._revoked: frozenset[str] = frozenset()
        self._scopes: dict[str, frozenset[str]] = {}
        self._checked = float("-inf")
        self._stale = True

    def __repr__(self) -> str:
        return f"StoreAdmins(records={len(self._cache)})"

    def watch(self) -> None:
        """Read again on the next call once another replica changes a record."""
        self._store.subscribe(self._on_change)

    def _on_change(self, change: StoreChange) -> None:
        if change.kind == "kv" and change.key.startswith(PREFIX):
            self._stale = True

    # -- readers ------------------------------------------------------------------------------

    def is_revoked(self, fingerprint: str) -> bool:
        self._refresh()
        return fingerprint in self._revoked

    def scope_of(self, fingerprint: str) -> frozenset[str] | None:
        self._refresh()
        return self._scopes.get(fingerprint)

    def entries(self) -> list[AdminEntry]:
        self._reload()
        listed = [e if e is not None else _unreadable(k) for k, (_, e) in self._cache.items()]
        return sorted(listed, key=lambda e: (e.issued_at, e.fingerprint))

    def _refresh(self) -> None:
        if self._stale or time.monotonic() - self._checked >= admins.RELOAD_SECONDS:
            self._reload()

    def _reload(self) -> None:
        self._stale, self._checked = False, time.monotonic()
        cache: dict[str, tuple[bytes, AdminEntry | None]] = {}
        for key in self._store.kv_keys(PREFIX):
            blob = self._store.kv_get(key)
            if blob is None:
                continue
            known = self._cache.get(key)
            cache[key] = known if known is not None and known[0] == blob else (blob, self._open(key, blob))
        self._cache = cache
        self._index()

    def _index(self) -> None:
        fps = {key: key[len(PREFIX) :] for key in self._cache}
        self._revoked = frozenset(fps[k] for k, (_, e) in self._cache.items() if e is None or e.revoked)
        self._scopes = {fps[k]: frozenset(e.environments) for k, (_, e) in self._cache.items() if e}

    def _open(self, key: str, blob: bytes) -> AdminEntry | None:
        try:
            entry = AdminEntry(**json.loads(self._kek.open(blob, key)))
        except (InvalidTag, ValueError, TypeError):
            log.warning("admin record does not decrypt: its certificate counts as revoked", key=key)
            return None
        return entry if entry.fingerprint == key[len(PREFIX) :] else None

    # -- writers ------------------------------------------------------------------------------

    async def record(
        self, name: str, role: str, issued: IssuedCert, environments: Iterable[str] = ()
    ) -> AdminEntry:
        entry = new_entry(name, role, issued, environments)
        await self._put(entry)
        return entry

    async def revoke(self, *, name: str = "", fingerprint: str = "") -> list[AdminEntry]:
        revocation_prefix(name=name, fingerprint=fingerprint)
        self._reload()
        before = [e for _, e in self._cache.values() if e is not None]
        entries = list(before)
        named = mark_revoked(entries, name=name, fingerprint=fingerprint)
        for i, entry in enumerate(entries):
            if i >= len(before) or entry is not before[i]:
                await self._put(entry)
        return named

    async def _put(self, entry: AdminEntry) -> None:
        key = PREFIX + entry.fingerprint
        blob = self._kek.seal(json.dumps(asdict(entry)).encode(), key)
        await self._store.kv_put(key, blob)
        self._cache[key] = (blob, entry)
        self._index()


def _unreadable(key: str) -> AdminEntry:
    return AdminEntry(key[len(PREFIX) :], UNREADABLE, "", "", "", "", revoked_at="(unreadable)")
