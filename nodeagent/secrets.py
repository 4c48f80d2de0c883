"""Secret values: a masked type, and a redactor that scrubs them from text.

A ``Secret`` never shows its value in ``repr``/``str``/f-strings; code that
really needs the value calls ``reveal()``. A ``Redactor`` holds every secret a
process knows and replaces each occurrence in output with ``[REDACTED]``: the
value, the halves of a join token, its base64 forms, and the secret shapes
kubeadm prints before anyone knows the value (``SHAPES``). A ``LineRedactor``
also masks a secret that a stream splits across two lines (``abcdef.`` then the
rest on the next one).
"""

from __future__ import annotations

import base64
import re
import threading
from collections.abc import Iterable

MASK = "[REDACTED]"
# Anything shorter is too likely to appear by chance (and too weak to be a real secret).
MIN_SECRET_LEN = 6
# Secret shapes masked even before the value is known; a group named "s" is the part masked.
# Flags whose value is a secret.
_CARRIER_FLAGS = "--(?:token|discovery-token|tls-bootstrap-token|certificate-key)"
SHAPES: tuple[re.Pattern[str], ...] = (
    # A kubeadm bootstrap token (id.16) or a tether join token (id.32), exactly: host names such
    # as static.cloudflareinsights.com or API groups such as policy.admissionregistration.k8s.io
    # are longer words and stay as they are.
    re.compile(r"(?<![a-z0-9])[a-z0-9]{6}\.[a-z0-9]{16}(?:[a-z0-9]{16})?(?![a-z0-9])"),
    # Whatever follows a flag that carries a secret, in either form (space or "=").
    re.compile(r"(?<![\w-])" + _CARRIER_FLAGS + r"(?:=|[ \t]+)['\"]?(?P<s>[^\s'\"]+)"),
    # A certificate key printed on its own (kubeadm: "Using certificate key:" then the value).
    re.compile(r"(?i)certificate[ _-]key[\"']?:?[ \t]*(?P<s>[a-f0-9]{64})"),
)
# A line ending like this leaves its secret to the start of the next line: a token id (then the
# next line starts with the rest of a token), or a flag or label that carries a secret (then
# the next line's first word is it).
_ID_TAIL = re.compile(r"(?<![a-z0-9])[a-z0-9]{6}\.[ \t]*$")
_TOKEN_REST = re.compile(r"^([ \t]*)[a-z0-9]{16}(?:[a-z0-9]{16})?(?![a-z0-9])")
_VALUE_TAIL = re.compile(r"(?:(?<![\w-])" + _CARRIER_FLAGS + r"=?|(?i:certificate[ _-]key:?))[ \t]*$")
_FIRST_WORD = re.compile(r"^([ \t]*)\S+")
# Cheap tests that every shape above needs to match (a superset, searched with a literal first):
# a dot then 16 token characters, on the same line or the next (token shapes, an id at a line's
# end); "--" (the flags); "certificate", in SHAPES' own case-insensitive form.
_TOKEN_HINT = re.compile(r"\.[ \t]*\n?[ \t]*[a-z0-9]{16}")
_CERT_HINT = re.compile(r"(?i)certificate")


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
            out.extend(_base64_forms(raw))
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
        return self.redact_cut(text)[0]

    def holds_nothing(self, text: str) -> bool:
        """True when ``text`` (one line or several) certainly holds nothing to mask: neither a
        known value nor anything a shape could match. About ten times cheaper than masking."""
        pattern = self._pattern
        if pattern is not None and pattern.search(text):
            return False
        return "--" not in text and not _TOKEN_HINT.search(text) and not _CERT_HINT.search(text)

    def redact_cut(self, text: str, limit: int | None = None) -> tuple[str, bool]:
        """``text`` masked, then cut after ``limit`` characters of it; and whether it was cut.

        Matching sees the whole text before anything is cut, and a secret that starts before
        the cut is masked whole: cutting can never leave the first characters of one behind.
        """
        if not text:
            return text, False
        if self.holds_nothing(text):
            return (text, False) if limit is None or len(text) <= limit else (text[:limit], True)
        spans = _merged(self._spans(text))
        out: list[str] = []
        pos = 0
        end = len(text) if limit is None else min(limit, len(text))
        for start, stop in spans:
            if start >= end:
                break
            out.append(text[pos:start])
            out.append(MASK)
            pos = stop
        if pos < end:
            out.append(text[pos:end])
        return "".join(out), end < len(text)

    def _spans(self, text: str) -> list[tuple[int, int]]:
        spans: list[tuple[int, int]] = []
        pattern = self._pattern
        if pattern is not None:
            spans.extend(m.span() for m in pattern.finditer(text))
        for shape in SHAPES:
            group = "s" if "s" in shape.groupindex else 0
            spans.extend(m.span(group) for m in shape.finditer(text))
        return spans

    def redact_all(self, lines: Iterable[str]) -> list[str]:
        return [self.redact(line) for line in lines]


class LineRedactor:
    """Redacts the lines of one stream in order, masking a secret split across two lines."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self._rest: re.Pattern[str] | None = None  # what starts the next line if it ends a secret

    def redact(self, line: str, limit: int | None = None) -> tuple[str, bool]:
        """Like ``Redactor.redact_cut``, for the next line of the stream."""
        text = line
        if self._rest is not None:
            text = self._rest.sub(lambda m: m.group(1) + MASK, line, count=1)
        self._rest = None
        if ("--" in line or _CERT_HINT.search(line)) and _VALUE_TAIL.search(line):
            self._rest = _FIRST_WORD
        elif line.rstrip(" \t").endswith(".") and _ID_TAIL.search(line):
            self._rest = _TOKEN_REST
        return self.redactor.redact_cut(text, limit)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, stop in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


def _base64_forms(raw: str) -> list[str]:
    """How ``raw`` reads in base64 (standard and URL-safe), alone or inside a longer encoding.

    Inside a longer encoding the value starts at one of three byte offsets; each offset gives a
    different run of characters that only the value decides (the ones shared with its
    neighbours are left out), so all three are masked.
    """
    data = raw.encode()
    forms = [base64.b64encode(data).decode()]
    for offset in range(3):
        encoded = base64.b64encode(bytes(offset) + data).decode()
        first, last = -(-8 * offset // 6), 8 * (offset + len(data)) // 6
        forms.append(encoded[first:last])
    forms += [f.replace("+", "-").replace("/", "_") for f in forms]
    return sorted({f for f in forms if len(f) >= MIN_SECRET_LEN and f != raw})


# Every secret this process has seen: the log pipeline scrubs them all.
PROCESS_REDACTOR = Redactor()
