"""``tetherctl audit``: who changed what, newest first (the controller's audit log)."""

from __future__ import annotations

import argparse
import itertools
from typing import Any

from rich.text import Text

from tether.controller import wire
from tether.controller.cli.client import Session
from tether.controller.cli.output import emit, shape, table, when
from tether.controller.client.pages import items

DEFAULT_LIMIT = 100  # records shown unless --limit says otherwise (0: every one kept)
HEADERS = ["TIME", "ADMIN", "METHOD", "ENVIRONMENT", "NODE", "OUTCOME", "DETAIL"]


def add_parser(sub: Any) -> None:
    a = sub.add_parser("audit", help="the audit log: every change made through the admin API, newest first")
    a.add_argument("--env", dest="environment", default="", help="only the records of this environment")
    a.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help=f"show at most this many records (default {DEFAULT_LIMIT}; 0: every one the controller keeps)",
    )
    a.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    a.set_defaults(func=audit)


def audit(args: argparse.Namespace) -> int:
    s = Session(args)
    page_size = min(args.limit, 1000) if args.limit > 0 else 0

    def fetch(token: str) -> Any:
        request = wire.admin.ListAuditRecordsRequest(
            environment=args.environment, page_size=page_size, page_token=token
        )
        return s.call("ListAuditRecords", request)

    records = items(fetch, lambda page: page.records)
    shown = s.collect(itertools.islice(records, args.limit) if args.limit > 0 else records)
    if args.output != "table":
        emit([shape(r) for r in shown], args.output)
        return 0
    rows = [
        [
            when(r.time_ms),
            r.admin,
            r.method,
            r.environment or "-",
            r.node or "-",
            _outcome(r.outcome),
            r.detail,
        ]
        for r in shown
    ]
    table(rows, HEADERS)
    return 0


def _outcome(outcome: str) -> Text:
    return Text(outcome, style="green" if outcome == "ok" else "bold red")
