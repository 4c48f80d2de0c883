"""``tetherctl version``: this client's version and, when it answers, the controller's."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tether.controller import __version__, wire
from tether.controller.cli.client import CliError, Session
from tether.controller.cli.output import emit


def add_parser(sub: Any) -> None:
    v = sub.add_parser(
        "version", help="client and controller versions (exit 1 when the controller cannot be reached)"
    )
    v.add_argument("--client", action="store_true", help="only this client's version; no connection")
    v.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    v.set_defaults(func=version)


def version(args: argparse.Namespace) -> int:
    data: dict[str, Any] = {"client": {"version": __version__}}
    problem = ""
    if not args.client:
        try:
            s = Session(args)
            info = s.call("GetVersion", wire.admin.GetVersionRequest())
            data["controller"] = {
                "version": info.version,
                "api_version": info.api_version,
                "address": s.conf.controller,
            }
        except CliError as exc:
            data["controller"] = None
            problem = str(exc)
    if args.output == "text":
        print(f"Client:     {__version__}")
        c = data.get("controller")
        if c:
            print(f"Controller: {c['version']} (API {c['api_version']}) at {c['address']}")
    else:
        emit(data, args.output)
    if problem:
        print(f"tetherctl: controller: {problem}", file=sys.stderr)
        return 1
    return 0
