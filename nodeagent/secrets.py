"""Secret values: a masked type, and a redactor that scrubs them from text.

A ``Secret`` never shows its value in ``repr``/``str``/f-strings; code that
really needs the value calls ``reveal()``. A ``Redactor`` holds every secret a
process knows and replaces each occurrence in output with ``[REDACTED]``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable

MASK = "[REDACTED]"
# Anything shorter is too likely to appear by chance (and too weak to be a real secret).
MIN_SECRET_LEN = 6


class Secret:
    """A string that does not print itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')" if self._value else "Secret('')"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("secrets are not picklable")


class Redactor:
    """Replaces every known secret value (and its obvious pieces) in text."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._values: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self.add(*values)

    def add(self, *values: str | Secret) -> None:
        new: set[str] = set()
        for v in values:
            raw = v.reveal() if isinstance(v, Secret) else v
            if not raw or len(raw) < MIN_SECRET_LEN:
                continue
            new.add(raw)
            # A join token "id.secret" must not leak by halves either.
            if "." in raw:
                new.update(p for p in raw.split(".") if len(p) >= 12)
        with self._lock:
            if new - self._values:
                self._values |= new
                ordered = sorted(self._values, key=len, reverse=True)
                self._pattern = re.compile("|".join(re.escape(s) for s in ordered))

    def __len__(self) -> int:
        return len(self._values)

    def __bool__(self) -> bool:
        # A redactor is an object to call, not a collection to test for emptiness.
        return True

    def redact(self, text: str) -> str:
        pattern = self._pattern
        if pattern is None or not text:
            return text
        return pattern.sub(MASK, text)

    def redact_all(self, lines: Iterable[str]) -> list[str]:
        pattern = self._pattern
        if pattern is None:
            return list(lines)
        return [pattern.sub(MASK, line) for line in lines]


# Every secret this process has seen: the log pipeline scrubs them all.
PROCESS_REDACTOR = Redactor()
