"""The YAML subset kubeadm configs and kubeconfigs use (the nodes have no PyYAML).

Block mappings and sequences, plain/quoted scalars, comments, ``---`` documents, ``[]``/``{}`` and
simple flow lists. Enough for kubeadm's Init/Join/ClusterConfiguration and kubeconfig files.
"""

from __future__ import annotations

import json
import re
from typing import Any

_LINE = re.compile(r"^(\s*)(.*)$")


def load_all(text: str) -> list[Any]:
    docs: list[list[tuple[int, str]]] = [[]]
    for raw in text.splitlines():
        if raw.strip() == "---" or raw.startswith("--- "):
            docs.append([])
            continue
        stripped = _strip_comment(raw)
        if not stripped.strip():
            continue
        indent = len(stripped) - len(stripped.lstrip(" "))
        docs[-1].append((indent, stripped.strip()))
    out = []
    for lines in docs:
        if lines:
            value, _ = _block(lines, 0, lines[0][0])
            out.append(value)
    return out


def load(text: str) -> Any:
    docs = load_all(text)
    return docs[0] if docs else None


def _strip_comment(line: str) -> str:
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def _block(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[Any, int]:
    if lines[i][1].startswith("- ") or lines[i][1] == "-":
        return _seq(lines, i, indent)
    return _map(lines, i, indent)


def _seq(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    while i < len(lines) and lines[i][0] == indent and (lines[i][1].startswith("- ") or lines[i][1] == "-"):
        rest = lines[i][1][1:].strip()
        if not rest:
            if i + 1 < len(lines) and lines[i + 1][0] > indent:
                value, i = _block(lines, i + 1, lines[i + 1][0])
            else:
                value, i = None, i + 1
            out.append(value)
            continue
        if _is_key(rest):
            # "- key: value" starts a mapping whose other keys sit at indent + 2
            sub = [(indent + 2, rest)]
            j = i + 1
            while j < len(lines) and lines[j][0] > indent:
                sub.append(lines[j])
                j += 1
            value, _ = _map(sub, 0, indent + 2)
            out.append(value)
            i = j
            continue
        out.append(_scalar(rest))
        i += 1
    return out, i


def _map(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    while i < len(lines) and lines[i][0] == indent and _is_key(lines[i][1]):
        key, _, rest = lines[i][1].partition(":")
        key = _scalar(key.strip())
        rest = rest.strip()
        i += 1
        if rest in ("|", "|-", ">", ">-"):
            block = []
            while i < len(lines) and lines[i][0] > indent:
                block.append(lines[i][1])
                i += 1
            out[key] = "\n".join(block) + ("" if rest.endswith("-") else "\n")
        elif rest:
            out[key] = _scalar(rest)
        elif i < len(lines) and (
            lines[i][0] > indent or (lines[i][0] == indent and lines[i][1].startswith("-"))
        ):
            out[key], i = _block(lines, i, lines[i][0])
        else:
            out[key] = None
    return out, i


def _is_key(text: str) -> bool:
    if text.startswith(("'", '"')):
        end = text.find(text[0], 1)
        return end > 0 and text[end + 1 : end + 2] == ":"
    head, sep, tail = text.partition(":")
    return bool(sep) and (tail == "" or tail.startswith(" ")) and not head.startswith(("[", "{"))


def _scalar(text: str) -> Any:
    if text.startswith('"') and text.endswith('"') and len(text) >= 2:
        return json.loads(text)
    if text.startswith("'") and text.endswith("'") and len(text) >= 2:
        return text[1:-1].replace("''", "'")
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [_scalar(p.strip()) for p in inner.split(",")] if inner else []
    if text == "{}":
        return {}
    if text in ("null", "~"):
        return None
    if text in ("true", "True"):
        return True
    if text in ("false", "False"):
        return False
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return text


def dump(value: Any, indent: int = 0) -> str:
    """Block-style YAML for dicts/lists of scalars (kubeconfig files)."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return pad + "{}\n"
        out = []
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                out.append(
                    f"{pad}{key}:\n{dump(item, indent + 2) if isinstance(item, dict) else dump(item, indent)}"
                )
            else:
                out.append(f"{pad}{key}: {_emit(item)}\n")
        return "".join(out)
    if isinstance(value, list):
        out = []
        for item in value:
            if isinstance(item, dict) and item:
                body = dump(item, indent + 2)
                out.append(pad + "- " + body[indent + 2 :])
            else:
                out.append(f"{pad}- {_emit(item)}\n")
        return "".join(out)
    return pad + _emit(value) + "\n"


def _emit(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    text = str(value)
    if (
        text == ""
        or re.search(r"[:#{}\[\],&*!|>'\"%@`]|^[-?\s]|\s$", text)
        or text in ("true", "false", "null")
    ):
        return json.dumps(text)
    return text
