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
        self._counts: dict[str, int] = {}
        self._pattern: re.Pattern[str] | None = None
        self.add(*values)

    @staticmethod
    def _forms(values: Iterable[str | Secret]) -> list[str]:
        out: list[str] = []
        for v in values:
            raw = v.reveal() if isinstance(v, Secret) else v
            if not raw or len(raw) < MIN_SECRET_LEN:
                continue
            out.append(raw)
            # A join token "id.secret" must not leak by halves either.
            if "." in raw:
                out.extend(p for p in raw.split(".") if len(p) >= 12)
        return out

    def add(self, *values: str | Secret) -> None:
        """Mask these values from now on (each add is matched by at most one ``discard``)."""
        forms = self._forms(values)
        with self._lock:
            fresh = [f for f in forms if f not in self._counts]
            for f in forms:
                self._counts[f] = self._counts.get(f, 0) + 1
            if fresh:
                self._rebuild()

    def discard(self, *values: str | Secret) -> None:
        """Forget values added for one call only (e.g. the SSH password of one bootstrap)."""
        forms = self._forms(values)
        with self._lock:
            gone = False
            for f in forms:
                n = self._counts.get(f, 0) - 1
                if n <= 0:
                    gone = gone or f in self._counts
                    self._counts.pop(f, None)
                else:
                    self._counts[f] = n
            if gone:
                self._rebuild()

    def _rebuild(self) -> None:
        ordered = sorted(self._counts, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(s) for s in ordered)) if ordered else None

    def __len__(self) -> int:
        return len(self._counts)

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
