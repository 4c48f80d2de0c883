"""Walks a parsed YAML mapping by field path, collecting every problem and note on the way.

Keys match case-insensitively (holodeck writes ``Installer`` and ``Version`` but ``source``), so
both spellings of a field are the same field; giving it twice is a problem. Keys nobody asked
for are reported by ``finish()`` as unknown fields, so a typo is caught instead of ignored; under
holodeck's apiVersion (``Problems.holodeck``), which ignores fields it does not know, they are
notes instead, except inside tether's own extensions (``Problems.strict_under``), which no
holodeck file has.

A path names each key as written, joined by ``.``; a key that has a ``.`` (or ``[``, ``]``, ``"``)
in it is quoted, ``spec.kubernetes["a.b"]``, so a path always says which key it is.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from tether.controller.errors import Problem

Check = Callable[[str], str]


UNKNOWN_NOTE = "ignored: not a holodeck field tether knows"


class Problems:
    """Every problem (its path and message) and note (``path: message``) found reading one document.

    ``holodeck``: the document is under holodeck's apiVersion (set by the loader once it has read
    ``apiVersion``); readers relax holodeck's leniencies under it, each with a note.
    """

    def __init__(self) -> None:
        self.items: list[Problem] = []
        self.notes: list[str] = []
        self.holodeck = False
        self.strict_under: tuple[str, ...] = ()

    def unknown(self, path: str) -> None:
        """A field nobody reads: a problem, or under holodeck's apiVersion a note.

        Paths are compared in any case, as keys match: ``spec.Rollout`` is ``spec.rollout``."""
        lower = path.lower()
        strict = any(
            lower == p or lower.startswith((f"{p}.", f"{p}[")) for p in (s.lower() for s in self.strict_under)
        )
        if self.holodeck and not strict:
            self.note(path, UNKNOWN_NOTE)
        else:
            self.add(path, "unknown field")

    def add(self, path: str, message: str) -> None:
        self.items.append(Problem(path, message))

    def note(self, path: str, message: str) -> None:
        self.notes.append(f"{path}: {message}")


def child_path(path: str, key: str) -> str:
    """``path.key``; a key that would make the path ambiguous (one with ``.``, ``[``, ``]`` or ``"``,
    or an empty one) is quoted: ``spec.kubernetes["a.b"]``, never ``spec.kubernetes.a.b``."""
    if not key or any(c in key for c in '.[]"'):
        return f"{path}[{json.dumps(key, ensure_ascii=False)}]"
    return f"{path}.{key}" if path else key


def _type_name(value: Any) -> str:
    return {dict: "a mapping", list: "a list", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), "a string" if isinstance(value, str) else type(value).__name__
    )


class Section:
    """One mapping at ``path``. Accessors return the value or the default, recording problems."""

    def __init__(self, raw: Mapping[Any, Any], path: str, problems: Problems) -> None:
        self.path = path
        self.problems = problems
        self._by_lower: dict[str, list[str]] = {}
        self._raw: dict[str, Any] = {}
        for key, value in raw.items():
            skey = str(key)
            self._raw[skey] = value
            self._by_lower.setdefault(skey.lower(), []).append(skey)
        self._seen: set[str] = set()

    @staticmethod
    def of(raw: Any, path: str, problems: Problems) -> Section | None:
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            problems.add(path, f"must be a mapping, not {_type_name(raw)}")
            return None
        return Section(raw, path, problems)

    def child(self, key: str) -> str:
        return child_path(self.path, key)

    def lookup(self, name: str) -> tuple[str, Any] | None:
        """The (key as written, value) for ``name``; both spellings given is a problem."""
        keys = self._by_lower.get(name.lower(), [])
        self._seen.update(keys)
        if not keys:
            return None
        if len(keys) > 1:
            self.problems.add(self.child(keys[1]), f"given twice (also as {keys[0]!r})")
        return keys[0], self._raw[keys[0]]

    def has(self, name: str) -> bool:
        return name.lower() in self._by_lower

    def raw(self, name: str) -> Any:
        found = self.lookup(name)
        return None if found is None else found[1]

    def path_of(self, name: str) -> str:
        keys = self._by_lower.get(name.lower(), [])
        return self.child(keys[0] if keys else name)

    def section(self, name: str) -> Section | None:
        found = self.lookup(name)
        if found is None:
            return None
        return Section.of(found[1], self.child(found[0]), self.problems)

    def string(
        self, name: str, default: str = "", *, check: Check | None = None, required: bool = False
    ) -> str:
        found = self.lookup(name)
        if found is None or found[1] is None or found[1] == "":
            if required:
                self.problems.add(self.path_of(name), "required")
            return default
        key, value = found
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            self.problems.add(self.child(key), f"must be a string, not {_type_name(value)}")
            return default
        text = str(value)
        if check is not None:
            reason = check(text)
            if reason:
                self.problems.add(self.child(key), f"{reason} (got {text[:80]!r})")
                return default
        return text

    def boolean(self, name: str, default: bool = False) -> bool:
        found = self.lookup(name)
        if found is None or found[1] is None:
            return default
        if not isinstance(found[1], bool):
            self.problems.add(self.child(found[0]), "must be true or false")
            return default
        return found[1]

    def integer(self, name: str, default: int, *, low: int, high: int) -> int:
        found = self.lookup(name)
        if found is None or found[1] is None:
            return default
        value = found[1]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.problems.add(self.child(found[0]), f"must be a whole number from {low} to {high}")
            return default
        return value

    def choice(self, name: str, options: tuple[str, ...], default: str) -> str:
        value = self.string(name, default)
        if value not in options:
            self.problems.add(self.path_of(name), f"must be one of {', '.join(options)} (got {value!r})")
            return default
        return value

    def items(self, name: str) -> list[tuple[str, Any]]:
        """A list field as ``(path, item)`` pairs."""
        found = self.lookup(name)
        if found is None or found[1] is None:
            return []
        key, value = found
        if not isinstance(value, list):
            self.problems.add(self.child(key), f"must be a list, not {_type_name(value)}")
            return []
        return [(f"{self.child(key)}[{i}]", item) for i, item in enumerate(value)]

    def string_map(self, name: str, *, key_check: Check, value_check: Check) -> dict[str, str]:
        """A mapping of strings to scalars (labels, env); every bad entry is a problem."""
        sub = self.section(name)
        if sub is None:
            return {}
        out: dict[str, str] = {}
        for key, value in sub._raw.items():
            sub._seen.add(key)
            path = sub.child(key)
            reason = key_check(key)
            if reason:
                self.problems.add(path, reason)
                continue
            if isinstance(value, bool):
                value = "true" if value else "false"
            if value is None:
                value = ""
            if not isinstance(value, (str, int, float)):
                self.problems.add(path, f"must be a string, not {_type_name(value)}")
                continue
            reason = value_check(str(value))
            if reason:
                self.problems.add(path, reason)
                continue
            out[key] = str(value)
        return out

    def ignore(self, name: str, why: str) -> None:
        """Accept a field tether does not use, with a note saying so."""
        found = self.lookup(name)
        if found is not None:
            self.problems.note(self.child(found[0]), why)

    def ignore_rest(self, why: str) -> None:
        for key in self._raw:
            if key not in self._seen:
                self._seen.add(key)
                self.problems.note(self.child(key), why)

    def finish(self) -> None:
        for key in self._raw:
            if key not in self._seen:
                self.problems.unknown(self.child(key))
