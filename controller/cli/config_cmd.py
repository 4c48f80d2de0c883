"""``tetherctl config``: the controllers of one admin config file (kubectl-style contexts)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tether.controller.adminconf import AdminConfig, Contexts
from tether.controller.cli.client import CliError, config_path
from tether.controller.cli.output import emit, table
from tether.controller.errors import InvalidArgument


def add_parser(sub: Any) -> None:
    c = sub.add_parser("config", help="contexts: several controllers in one admin config")
    verbs = c.add_subparsers(dest="verb", metavar="VERB", required=True)
    g = verbs.add_parser("get-contexts", help="the contexts of the admin config, the current one marked")
    g.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    g.set_defaults(func=get_contexts, offline=True)
    cur = verbs.add_parser("current-context", help="print the current context's name")
    cur.set_defaults(func=current_context, offline=True)
    u = verbs.add_parser("use-context", help="make NAME the current context")
    u.add_argument("name")
    u.set_defaults(func=use_context, offline=True)
    a = verbs.add_parser(
        "add-context",
        help="add (or replace) context NAME with a controller's admin.conf; "
        "a single-controller file becomes context 'default'",
    )
    a.add_argument("name")
    a.add_argument("--from", dest="source", required=True, help="an admin.conf written by a controller")
    a.add_argument("--use", action="store_true", help="and make it the current context")
    a.set_defaults(func=add_context, offline=True)


def _path(args: argparse.Namespace) -> Path:
    return config_path(args.config)


def _read(path: Path) -> Contexts:
    try:
        return Contexts.read(path)
    except InvalidArgument as exc:
        raise CliError(str(exc)) from None


def get_contexts(args: argparse.Namespace) -> int:
    contexts = _read(_path(args))
    rows = [
        {"name": e.context, "current": e.context == contexts.current, "controller": e.controller}
        | {"user": e.name, "role": e.role}
        for e in contexts.entries
    ]
    if args.output != "table":
        emit(rows, args.output)
        return 0
    table(
        [("*" if r["current"] else "", r["name"], r["controller"], r["user"], r["role"]) for r in rows],
        ("CURRENT", "NAME", "CONTROLLER", "USER", "ROLE"),
    )
    return 0


def current_context(args: argparse.Namespace) -> int:
    contexts = _read(_path(args))
    if not contexts.current:
        raise CliError(f"{_path(args)} has no current-context")
    print(contexts.current)
    return 0


def use_context(args: argparse.Namespace) -> int:
    path = _path(args)
    try:
        _read(path).use(args.name, path).write(path)
    except InvalidArgument as exc:
        raise CliError(str(exc)) from None
    print(f"current context: {args.name}")
    return 0


def add_context(args: argparse.Namespace) -> int:
    path = _path(args)
    try:
        source = AdminConfig.read(Path(args.source))
        contexts = _read(path) if path.exists() else Contexts(())
        merged = contexts.with_context(source, args.name)
        (merged.use(args.name, path) if args.use else merged).write(path)
    except InvalidArgument as exc:
        raise CliError(str(exc)) from None
    print(f"context {args.name}: {source.controller} (in {path})")
    return 0
