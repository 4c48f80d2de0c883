"""``tether-controller admin issue|list|revoke --store-key-file F [--store URL]``: the admin registry
and CA kept in a store (see ``tether.controller.identity.stored``), from any host that can reach it.

A revocation written here is refused by every running replica within a second. Without ``--store``
the store is the SQLite file in ``--data-dir``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import structlog

from tether.controller.adminconf import AdminConfig
from tether.controller.admins import AdminEntry, parse_environments
from tether.controller.errors import ControllerError, InvalidArgument
from tether.controller.identity.keyfile import KeyFileError, StoreKey, read_key_file
from tether.controller.identity.model import Identity
from tether.controller.identity.stored import IdentityMissing, load_stored_identity
from tether.controller.store import SqliteStore, open_store
from tether.controller.store.base import Store
from tether.controller.store.migrations import is_postgres_url
from tether.nodeagent.model import now_ms


def admin_store_command(args: argparse.Namespace) -> int:
    try:
        with _quiet_logs():
            return asyncio.run(_run(args))
    except (ControllerError, OSError) as exc:
        print(f"tether-controller: {exc}", file=sys.stderr)
        return 1


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """Warnings only, on stderr, while the command runs: stdout is its own output."""
    if structlog.is_configured():
        yield
        return
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )
    try:
        yield
    finally:
        structlog.reset_defaults()


async def _run(args: argparse.Namespace) -> int:
    if args.store_key_file is None:
        raise KeyFileError(
            "--store needs --store-key-file PATH: the key that seals the controller identity in it"
        )
    location = args.store or str(args.data_dir / "tether.db")
    key = None
    if is_postgres_url(location):  # it signs the notices that tell the running replicas
        key = StoreKey(args.store_key_file, await asyncio.to_thread(read_key_file, args.store_key_file))
    store = await open_admin_store(location, key.key if key is not None else None)
    try:
        identity = await load_stored_identity(store, args.store_key_file, create=False, key=key)
        if args.verb == "issue":
            await _issue(args, identity, store)
        elif args.verb == "list":
            print_admins(identity.admins.entries())
        else:
            print_revoked(await identity.admins.revoke(name=args.name, fingerprint=args.fingerprint))
    finally:
        await store.close()
    return 0


async def open_admin_store(location: str, notify_key: bytes | None = None) -> Store:
    """The store at ``location`` (a PostgreSQL URL, opened with the key of --store-key-file, or a
    SQLite file), which must exist."""
    if is_postgres_url(location):
        return await open_store(location, notify_key=notify_key)
    path = Path(location)
    if not await asyncio.to_thread(path.exists):
        raise IdentityMissing(f"no controller store at {path} (start the controller once)")
    return SqliteStore(path)


def print_admins(entries: Iterable[AdminEntry]) -> None:
    print(f"{'NAME':<24} {'ROLE':<10} {'FINGERPRINT':<16} {'EXPIRES':<25} {'REVOKED':<25} SCOPE")
    for e in entries:
        revoked_at, scope = e.revoked_at or "-", ",".join(e.environments) or "*"
        print(
            f"{e.name:<24} {e.role:<10} {e.fingerprint[:16]:<16} {e.not_after:<25} {revoked_at:<25} {scope}"
        )


def print_revoked(entries: Iterable[AdminEntry]) -> None:
    for e in entries:
        print(f"revoked {e.fingerprint[:16]} ({e.role or 'unknown role'} access for {e.name!r})")


def print_issued(args: argparse.Namespace, environments: list[str], address: str, fingerprint: str) -> None:
    """What ``admin issue`` wrote (the certificate's fingerprint prefix; never its key)."""
    scope = f" (environments {', '.join(environments)})" if environments else ""
    print(f"wrote {args.out}: {args.role} access for {args.name!r}{scope} to {address} ({fingerprint[:16]})")


async def _issue(args: argparse.Namespace, identity: Identity, store: Store) -> None:
    """Sign an admin certificate with the shared CA, record it, write a complete admin config."""
    environments = parse_environments(args.environments)
    address = await asyncio.to_thread(_address, args, store)
    ca = identity.ca
    key_pem, issued = ca.issue_admin(args.name, args.role, days=args.days, environments=environments)
    await identity.admins.record(args.name, args.role, issued, environments)
    conf = AdminConfig(address, ca.ca_hash, ca.cert_pem, issued.cert_pem, key_pem, args.name, args.role)
    await asyncio.to_thread(conf.write, args.out)
    print_issued(args, environments, address, issued.fingerprint)


def _address(args: argparse.Namespace, store: Store) -> str:
    """Where tetherctl goes: --controller, else this host's admin.conf, else a live replica."""
    if args.controller:
        return str(args.controller)
    local = args.data_dir / "admin.conf"
    if local.exists():
        return AdminConfig.read(local).controller
    live = _live_replicas(store)
    if not live:
        raise InvalidArgument(
            "no live controller replica is registered in the store: give --controller HOST:PORT"
        )
    return live[0]


def _live_replicas(store: Store) -> list[str]:
    from tether.controller.replicas.registry import PREFIX, Replica

    now = now_ms()
    found = []
    for key in store.kv_keys(PREFIX):
        raw = store.kv_get(key)
        replica = Replica.from_bytes(key[len(PREFIX) :], raw) if raw is not None else None
        if replica is not None and replica.live(now):
            found.append(replica.address)
    return sorted(found)
