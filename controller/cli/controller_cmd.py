"""``tetherctl controller list``: the controller replicas sharing one store, and which one leads."""

from __future__ import annotations

import argparse
from typing import Any

from rich.text import Text

from tether.controller import wire
from tether.controller.cli.client import CliError, Session
from tether.controller.cli.output import LIST_FORMATS, ago, emit, shape, table, when

HEADERS = ["ADDRESS", "VERSION", "LAST SEEN", "LEADER", "STATUS"]


def add_parser(sub: Any) -> None:
    c = sub.add_parser("controller", help="controller replicas").add_subparsers(dest="verb", required=True)
    ls = c.add_parser(
        "list", help="the replicas sharing the store: address, version, last seen, and the leader"
    )
    ls.add_argument("-o", "--output", choices=LIST_FORMATS, default="table")
    ls.set_defaults(func=list_controllers)


def list_controllers(args: argparse.Namespace) -> int:
    listed = Session(args).call("ListControllers", wire.admin.ListControllersRequest()).controllers
    if args.output not in ("table", "wide"):
        emit([shape(r) for r in listed], args.output)
        return 0
    wide = args.output == "wide"
    rows = []
    for r in listed:
        row: list[Any] = [r.address or "-", r.version or "-", ago(r.last_seen_ms), _leader(r.leader)]
        row.append(Text("live", style="green") if r.live else Text("gone", style="red"))
        rows.append([*row, when(r.started_ms), r.id] if wide else row)
    table(rows, [*HEADERS, "STARTED", "ID"] if wide else HEADERS)
    return 0


def _leader(leader: bool) -> Text:
    return Text("yes", style="bold") if leader else Text("-")


def live_addresses(session: Session) -> list[str]:
    """The live replicas' addresses (the answering one first); [] from a controller without
    ``ListControllers``."""
    try:
        listed = session.call("ListControllers", wire.admin.ListControllersRequest()).controllers
    except CliError:  # an older controller: its own address is all there is
        return []
    return [r.address for r in listed if r.live and r.address]
