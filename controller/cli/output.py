"""Output formats: readable tables by default, ``-o json`` / ``-o yaml`` for scripts."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import yaml
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message


def to_dict(msg: Message) -> dict[str, Any]:
    return MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def emit(data: Any, fmt: str, out: TextIO = sys.stdout) -> None:
    if fmt == "json":
        json.dump(data, out, indent=2, sort_keys=False)
        out.write("\n")
    elif fmt == "yaml":
        yaml.safe_dump(data, out, sort_keys=False)
    else:
        raise ValueError(fmt)


def table(
    rows: Sequence[Sequence[Any]], headers: Sequence[str], out: TextIO = sys.stdout, indent: str = ""
) -> None:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for r in cells:
        out.write(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")


def when(ms: int) -> str:
    if not ms:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def ago(ms: int) -> str:
    if not ms:
        return "never"
    seconds = max(0, int(dt.datetime.now(dt.timezone.utc).timestamp() - ms / 1000))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"
