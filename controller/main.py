"""``tether-controller``: run the controller.

tether-controller serve [--listen HOST:PORT] [--data-dir DIR] [--advertise HOST:PORT] [--san NAME ...]
                        [--max-document-bytes N] [--enroll-rate PER_SECOND]
                        [--node-output-rate BYTES_PER_SECOND] [--metrics-listen HOST:PORT]
                        [--store postgresql://USER@HOST:PORT/DB --store-key-file PATH]
tether-controller admin issue --name NAME [--role admin|read-only] [--environments E1,E2] [--days N]
                              --out FILE
tether-controller admin list | revoke (--name NAME | --fingerprint PREFIX)
    (admin *: [--store URL] --store-key-file F for the identity kept in a store; issue: [--controller A])
tether-controller agent-bundle add FILE | list [--agent-bundles DIR | --data-dir DIR]
tether-controller migrate [--store URL | --data-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tether.controller.config import ControllerConfig
from tether.controller.limits import ENROLL_RATE_PER_SECOND, NODE_OUTPUT_BYTES_PER_SECOND
from tether.nodeagent import logs
from tether.nodeagent.limits import MAX_DOCUMENT_BYTES

if TYPE_CHECKING:
    from tether.controller.admins import AdminRegistry


def _positive(text: str) -> int:
    """A byte count (``--max-document-bytes``): a whole number above 0."""
    return int(_above_zero(text, int, "a number of bytes"))


def _positive_rate(text: str) -> float:
    """A rate (``--enroll-rate``, ``--node-output-rate``): a number above 0."""
    return _above_zero(text, float, "a rate (per second)")


def _above_zero(text: str, kind: type[int] | type[float], what: str) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether-controller", description="tether controller")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the gRPC controller")
    s.add_argument(
        "--listen", default="127.0.0.1:7443", help="HOST:PORT to listen on (port 0: pick a free one)"
    )
    s.add_argument(
        "--data-dir",
        type=Path,
        default=Path("/var/lib/tether-controller"),
        help="state directory: SQLite store, CA, admin.conf",
    )
    s.add_argument(
        "--store",
        default="",
        metavar="URL",
        help="where the state lives: postgresql://USER@HOST:PORT/DB (controller replicas share it) or "
        "a SQLite file (default: DATA_DIR/tether.db)",
    )
    s.add_argument(
        "--store-key-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="the key that seals the CA, secret box and admin registry in the store (required with "
        "PostgreSQL; the first replica creates it, 0600: give the others a copy)",
    )
    s.add_argument(
        "--advertise", default="", help="HOST:PORT agents should use (default: the listen address)"
    )
    s.add_argument("--san", action="append", default=[], help="extra name or IP for the serving certificate")
    s.add_argument("--heartbeat-seconds", type=int, default=30, help="agents' health report interval")
    s.add_argument("--node-cert-days", type=float, default=30.0, help="lifetime of node certificates")
    s.add_argument(
        "--max-document-bytes",
        type=_positive,
        default=MAX_DOCUMENT_BYTES,
        help="largest environment document accepted (the message size limit follows it)",
    )
    s.add_argument(
        "--node-output-rate",
        type=_positive_rate,
        default=NODE_OUTPUT_BYTES_PER_SECOND,
        help="bytes of step output stored per node and second; more is summarised, not stored",
    )
    s.add_argument(
        "--enroll-rate",
        type=_positive_rate,
        default=ENROLL_RATE_PER_SECOND,
        help="enrollments accepted per second, all callers together (a fleet coming up at once: raise it)",
    )
    s.add_argument(
        "--agent-bundles",
        type=Path,
        default=None,
        help="directory of agent bundles of other versions (default DATA_DIR/agent-bundles)",
    )
    s.add_argument(
        "--agent-platform",
        default="",
        help="PYTHON/ARCH the controller's own agent bundle is built for (default: the controller's own)",
    )
    s.add_argument(
        "--metrics-listen",
        default="",
        metavar="HOST:PORT",
        help="serve Prometheus /metrics, /healthz and /readyz over plain HTTP here (default: off; port 0 "
        "picks a free one)",
    )
    s.add_argument("--log-level", default="info")
    admin = sub.add_parser("admin", help="admin credentials").add_subparsers(dest="verb", required=True)
    issue = admin.add_parser("issue", help="write an admin config for another operator or a platform client")
    issue.add_argument("--data-dir", type=Path, default=Path("/var/lib/tether-controller"))
    issue.add_argument("--name", required=True, help="who it is for (recorded in its certificate)")
    issue.add_argument("--role", choices=("admin", "read-only"), default="read-only")
    issue.add_argument(
        "--environments",
        default="",
        metavar="E1,E2",
        help="limit it to these environments (comma-separated; default: every environment)",
    )
    issue.add_argument("--days", type=float, default=365.0, help="certificate lifetime")
    issue.add_argument("--out", type=Path, required=True, help="where to write it (mode 0600)")
    issue.add_argument(
        "--controller",
        default="",
        metavar="HOST:PORT",
        help="with --store-key-file: the address it names (default: DATA_DIR/admin.conf's, else a "
        "live replica's)",
    )
    listing = admin.add_parser("list", help="admin certificates issued, and which are revoked")
    listing.add_argument("--data-dir", type=Path, default=Path("/var/lib/tether-controller"))
    revoke = admin.add_parser(
        "revoke", help="revoke admin certificates: the running controller refuses them within a second"
    )
    revoke.add_argument("--data-dir", type=Path, default=Path("/var/lib/tether-controller"))
    who = revoke.add_mutually_exclusive_group(required=True)
    who.add_argument("--name", default="", help="every unrevoked certificate issued to this name")
    who.add_argument("--fingerprint", default="", help="one certificate (a unique prefix, from admin list)")
    for sp in (issue, listing, revoke):  # the identity kept in a store (tether.controller.identity)
        sp.add_argument(
            "--store", default="", help="the controllers' store (postgresql://...; default: DATA_DIR's)"
        )
        sp.add_argument(
            "--store-key-file", type=Path, default=None, help="the key file that seals the identity in it"
        )
    bundles = sub.add_parser("agent-bundle", help="agent bundles for agent upgrades").add_subparsers(
        dest="verb", required=True
    )
    add = bundles.add_parser("add", help="check a bundle and put it in the bundle directory")
    add.add_argument("file", type=Path)
    for sp in (add, bundles.add_parser("list", help="the bundles in the bundle directory")):
        sp.add_argument("--data-dir", type=Path, default=Path("/var/lib/tether-controller"))
        sp.add_argument("--agent-bundles", type=Path, default=None, help="default DATA_DIR/agent-bundles")
    migrate = sub.add_parser("migrate", help="apply the store's schema migrations now (serve does at start)")
    where = migrate.add_mutually_exclusive_group()
    where.add_argument(
        "--store", default="", metavar="URL", help="postgresql://USER@HOST:PORT/DB or a SQLite file"
    )
    where.add_argument(
        "--data-dir", type=Path, default=Path("/var/lib/tether-controller"), help="its tether.db"
    )
    sub.add_parser("version", help="print the version")
    return p


def migrate_command(args: argparse.Namespace) -> int:
    """``tether-controller migrate``: what it applied, one line each (nothing: up to date)."""
    from tether.controller.errors import ControllerError
    from tether.controller.store import migrations

    location = args.store or args.data_dir / "tether.db"
    if not migrations.is_postgres_url(str(location)) and not Path(location).is_file():
        print(f"tether-controller: no store at {location} (nothing to migrate)", file=sys.stderr)
        return 1
    try:
        applied = asyncio.run(migrations.apply(location))
    except (ControllerError, OSError) as exc:
        print(f"tether-controller: {exc}", file=sys.stderr)
        return 1
    for line in applied:
        print(f"applied {line}")
    print(
        "the store's schema is up to date"
        if applied
        else "nothing to apply: the store's schema is up to date"
    )
    return 0


def bundle_command(args: argparse.Namespace) -> int:
    """``tether-controller agent-bundle add|list``: the running controller sees a new file at once."""
    from tether.controller.agentbundles import AgentBundles, add_file
    from tether.controller.errors import ControllerError

    directory = args.agent_bundles or args.data_dir / "agent-bundles"
    try:
        if args.verb == "add":
            held = add_file(directory, args.file)
            print(f"added agent {held.version} ({held.size} bytes, sha256 {held.sha256}) as {held.path}")
            return 0
        for target in AgentBundles(directory).versions():
            print(f"{target.version:<24} {target.size:>12} {target.sha256}")
    except (ControllerError, OSError) as exc:
        print(f"tether-controller: {exc}", file=sys.stderr)
        return 1
    return 0


def admin_command(args: argparse.Namespace) -> int:
    """``tether-controller admin issue|list|revoke``: run on the controller's host, as its user."""
    from tether.controller.admins import AdminRegistry
    from tether.controller.errors import ControllerError
    from tether.controller.identity.cli import print_admins, print_revoked

    if args.store or args.store_key_file is not None:
        from tether.controller.identity.cli import admin_store_command

        return admin_store_command(args)
    current = args.data_dir / "admin.conf"
    if not (args.data_dir / "pki" / "ca.key").exists() or not current.exists():
        print(
            f"tether-controller: no controller state in {args.data_dir} (start the controller once)",
            file=sys.stderr,
        )
        return 1
    registry = AdminRegistry(args.data_dir / "pki")
    try:
        if args.verb == "issue":
            return issue_admin(args, registry)
        if args.verb == "list":
            print_admins(registry.entries())
            return 0
        revoked = registry.revoke(name=args.name, fingerprint=args.fingerprint)
    except ControllerError as exc:
        print(f"tether-controller: {exc}", file=sys.stderr)
        return 1
    print_revoked(revoked)
    return 0


def issue_admin(args: argparse.Namespace, registry: AdminRegistry) -> int:
    """Sign an admin certificate with the controller's CA, record it, write a complete admin config."""
    from tether.controller.adminconf import AdminConfig
    from tether.controller.admins import parse_environments
    from tether.controller.ca import CertificateAuthority
    from tether.controller.identity.cli import print_issued

    environments = parse_environments(args.environments)
    ca = CertificateAuthority.load_or_create(args.data_dir / "pki")
    address = AdminConfig.read(args.data_dir / "admin.conf").controller
    key_pem, issued = ca.issue_admin(args.name, args.role, days=args.days, environments=environments)
    registry.record(args.name, args.role, issued, environments)
    AdminConfig(address, ca.ca_hash, ca.cert_pem, issued.cert_pem, key_pem, args.name, args.role).write(
        args.out
    )
    print_issued(args, environments, address, issued.fingerprint)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "version":
        from tether.controller import __version__

        print(__version__)
        return 0
    if args.command == "admin":
        return admin_command(args)
    if args.command == "agent-bundle":
        return bundle_command(args)
    if args.command == "migrate":
        return migrate_command(args)
    logs.configure(args.log_level)
    config = ControllerConfig(
        data_dir=args.data_dir,
        listen=args.listen,
        advertise=args.advertise,
        extra_sans=tuple(args.san),
        heartbeat_seconds=args.heartbeat_seconds,
        node_cert_days=args.node_cert_days,
        log_level=args.log_level,
        max_document_bytes=args.max_document_bytes,
        enroll_rate_per_second=args.enroll_rate,
        node_output_bytes_per_second=args.node_output_rate,
        agent_bundles_dir=args.agent_bundles,
        agent_platform=args.agent_platform,
        metrics_listen=args.metrics_listen,
        store=args.store,
        store_key_file=args.store_key_file,
    )

    def ready(address: str) -> None:
        print(
            f"tether-controller listening on {address} (admin config: {args.data_dir / 'admin.conf'})",
            flush=True,
        )

    from tether.controller.errors import ControllerError

    try:
        from tether.controller.server import serve

        _install_uvloop()
        asyncio.run(serve(config, on_ready=ready, on_metrics=lambda a: print(f"metrics on {a}", flush=True)))
    except (OSError, ControllerError) as exc:  # start-up problems: one line, not a traceback
        print(f"tether-controller: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    uvloop.install()


if __name__ == "__main__":
    sys.exit(main())
