"""Output formats: tables for people (``rich``: colours, widths, plain off a terminal), ``-o json``
and ``-o yaml`` for scripts.

Every json/yaml view goes through ``shape`` (a protobuf message) or ``shape_times`` (a plain dict):
counts, generations and sequence numbers stay numbers, and a ``*_ms`` field becomes an RFC 3339 UTC
string under the name without ``_ms`` (``last_seen_ms`` -> ``last_seen``; never set -> null), or
``<name>_at`` where the message has a field of that name already (``Rollout.updated`` is a count).
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import yaml
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

TIME_SUFFIX = "_ms"
LIST_FORMATS = ("table", "wide", "json", "yaml")
UNLIMITED_WIDTH = 10_000  # off a terminal a row is never wrapped: scripts read whole lines
STATE_STYLES = {
    "provisioned": "green",
    "succeeded": "green",
    "active": "green",
    "updated": "green",
    "complete": "green",
    "available": "green",
    "Ready": "green",
    "provisioning": "yellow",
    "running": "yellow",
    "progressing": "yellow",
    "waiting": "yellow",
    "pending": "cyan",
    "paused": "cyan",
    "failed": "bold red",
    "quarantined": "bold magenta",
    "halted": "bold red",
    "NotReady": "red",
    "revoked": "red",
    "expired": "dim",
    "used up": "dim",
    "offline": "dim",
    "skipped": "dim",
}


def to_dict(msg: Message) -> dict[str, Any]:
    """The message as protobuf's own JSON mapping (proto field names; 64-bit integers as strings)."""
    return MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def rfc3339(ms: int) -> str | None:
    """Milliseconds since the epoch as ``2024-05-01T12:00:00.123Z``; 0 (never) as None."""
    if not ms:
        return None
    t = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(ms) % 1000:03d}Z"


def shape(msg: Message) -> dict[str, Any]:
    """A message as a script-friendly dict: every field present, numbers as numbers, times as
    RFC 3339 strings (see the module docstring), an unset sub-message as None."""
    out: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        name = field.name
        if _is_time(field):
            out[time_name(name, msg.DESCRIPTOR.fields_by_name)] = rfc3339(value)
        elif field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[name] = {k: _scalar(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            out[name] = [_scalar(field, v) for v in value]
        elif field.message_type is not None and not msg.HasField(name):
            out[name] = None
        else:
            out[name] = _scalar(field, value)
    return out


def time_name(name: str, taken: Mapping[str, Any]) -> str:
    """``updated_ms`` -> ``updated``, or ``updated_at`` when ``updated`` is taken."""
    bare = name[: -len(TIME_SUFFIX)]
    return f"{bare}_at" if bare in taken else bare


def _is_time(field: Any) -> bool:
    return (
        field.name.endswith(TIME_SUFFIX)
        and not field.is_repeated
        and field.type in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64)
    )


def _scalar(field: Any, value: Any) -> Any:
    if isinstance(value, Message):
        return shape(value)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode()
    if field.type == FieldDescriptor.TYPE_ENUM and field.enum_type is not None:
        return str(field.enum_type.values_by_number[value].name).lower()
    return value


def shape_times(data: Mapping[str, Any]) -> dict[str, Any]:
    """A plain dict (``Event.to_json()``) with its ``*_ms`` integers as RFC 3339 strings."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key.endswith(TIME_SUFFIX) and isinstance(value, int):
            out[time_name(key, data)] = rfc3339(value)
        else:
            out[key] = value
    return out


def plain(text: str) -> str:
    """A docstring as help text: without reStructuredText's ``literal`` quotes."""
    return text.replace("``", "")


def emit(data: Any, fmt: str, out: TextIO = sys.stdout) -> None:
    if fmt == "json":
        json.dump(data, out, indent=2, sort_keys=False)
        out.write("\n")
    elif fmt == "yaml":
        yaml.safe_dump(data, out, sort_keys=False)
    else:
        raise ValueError(fmt)


def colour(state: str) -> Text:
    """A state word in its colour (shown only on a colour terminal)."""
    return Text(state, style=STATE_STYLES.get(state, ""))


def terminal_width(out: TextIO) -> int | None:
    """The terminal's width when ``out`` is one, else None."""
    try:
        return os.get_terminal_size(out.fileno()).columns if out.isatty() else None
    except (OSError, ValueError, io.UnsupportedOperation):
        return None


def render(renderable: Any, out: TextIO = sys.stdout, max_width: int | None = None) -> None:
    """Print a rich renderable: coloured and fitted on a terminal; plain, unwrapped lines elsewhere
    (``NO_COLOR`` is honoured); never wider than ``max_width``; no trailing blanks."""
    width = terminal_width(out)
    tty = width is not None
    if width is None:
        width = max_width or UNLIMITED_WIDTH
    elif max_width:
        width = min(width, max_width)
    buf = io.StringIO()
    console = Console(
        file=buf,
        width=width,
        force_terminal=tty,
        color_system="auto" if tty else None,
        highlight=False,
        emoji=False,
        markup=False,
        soft_wrap=False,
    )
    console.print(renderable)
    for line in buf.getvalue().splitlines():
        out.write(line.rstrip() + "\n")


def make_table(headers: Sequence[str]) -> Table:
    """A borderless table in kubectl's style: bold headers, two spaces between columns."""
    t = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold")
    for h in headers:
        t.add_column(h, overflow="fold")
    return t


def table(
    rows: Sequence[Sequence[Any]],
    headers: Sequence[str],
    out: TextIO = sys.stdout,
    indent: str = "",
    max_width: int | None = None,
) -> None:
    """Rows under headers; a cell may be a ``rich.text.Text`` (a coloured state), None shows empty."""
    t = make_table(headers)
    for r in rows:
        t.add_row(*(c if isinstance(c, Text) else Text("" if c is None else str(c)) for c in r))
    render(Padding(t, (0, 0, 0, len(indent))) if indent else t, out, max_width)


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


def until(ms: int) -> str:
    """How far ahead ``ms`` is, in its largest unit or two: ``in 45s``, ``in 3m20s``, ``in 2h5m``."""
    seconds = max(0, round(ms / 1000 - dt.datetime.now(dt.timezone.utc).timestamp()))
    if seconds < 60:
        return f"in {seconds}s"
    for unit, size, small, small_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if seconds >= size:
            rest = (seconds % size) // small_size
            return f"in {seconds // size}{unit}{f'{rest}{small}' if rest else ''}"
    return f"in {seconds}s"  # not reached


def eta(ms: int) -> str:
    """An ETA for a table: ``in 3m20s``, or ``-`` (none: not provisioning, or no history yet)."""
    return until(ms) if ms else "-"


def straggler(flag: bool) -> Text:
    """The STRAGGLER cell: ``yes`` in red, or ``-``."""
    return Text("yes", style="bold red") if flag else Text("-")
