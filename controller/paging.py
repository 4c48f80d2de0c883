"""Paging of the admin API's lists (AIP-158): page sizes, a byte bound, opaque page tokens.

A list is ordered by a string key (a name; tokens: creation time, then id) and paged by keyset: a
page holds the items whose key follows the last key of the page before. The page token carries
that key and a digest of the request's other fields (and of the key itself), so a token given to
another request, or changed, or garbage, is ``INVALID_ARGUMENT``. Tokens are opaque, not secret:
what a caller may see is checked on every item, whatever the token says.

The functions take already-ordered iterables (``after``, ``keyset`` build them) so a caller can put
a filter (e.g. the environments an admin's scope allows) between the store and ``take``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from google.protobuf.message import Message

from tether.controller.errors import InvalidArgument, Problem
from tether.nodeagent.limits import KiB, MiB

DEFAULT_PAGE_SIZE = 100  # items a page holds when the request says page_size 0
MAX_PAGE_SIZE = 1000  # a larger page_size is lowered to this
MAX_PAGE_BYTES = 2 * MiB  # a page ends early before its items pass this, encoded (at least one item)
MAX_PAGE_TOKEN_BYTES = 4 * KiB  # a longer page_token is refused without being decoded

T = TypeVar("T")
M = TypeVar("M", bound=Message)


@dataclass(frozen=True)
class PageRequest:
    """What one list call asks for: how many items, after which key, under which query."""

    size: int
    after: str  # "" = from the first item
    query: str  # digest of the method and the request's other fields

    @staticmethod
    def parse(method: str, page_size: int, page_token: str, **fields: object) -> PageRequest:
        """The page a request asks for; ``fields`` are the request's fields other than paging."""
        query = _digest(method, fields)
        return PageRequest(size=page_size_of(page_size), after=decode_token(page_token, query), query=query)

    def token_after(self, key: str) -> str:
        """The token of the page that follows the item ``key``."""
        return encode_token(key, self.query)


@dataclass(frozen=True)
class Page(Generic[M]):
    items: list[M]
    next_page_token: str  # "" on the last page


def page_size_of(requested: int) -> int:
    """The page size to use: the default for 0, at most the maximum."""
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def encode_token(after: str, query: str) -> str:
    payload = json.dumps({"after": after, "q": _check(query, after)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")


def decode_token(token: str, query: str) -> str:
    """The key a page token continues after ("" for no token); INVALID_ARGUMENT unless it is one
    this query handed out."""
    if not token:
        return ""
    message = (
        "page_token is not valid for this request (it came with other request fields, was changed, "
        "or is not a page token): list again without it"
    )
    invalid = InvalidArgument(message, [Problem("page_token", message)])
    if len(token) > MAX_PAGE_TOKEN_BYTES:
        raise invalid
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        doc = json.loads(raw)
    except (binascii.Error, ValueError):
        raise invalid from None
    if not isinstance(doc, dict) or not isinstance(doc.get("after"), str) or not doc["after"]:
        raise invalid
    after: str = doc["after"]
    if doc.get("q") != _check(query, after):
        raise invalid
    return after


def after(items: Iterable[T], start: str, key: Callable[[T], str]) -> Iterator[T]:
    """``items`` (sorted by ``key``) whose key follows ``start``."""
    return (item for item in items if key(item) > start)


def keyset(
    fetch: Callable[[str, int], Sequence[T]], start: str, chunk: int, key: Callable[[T], str]
) -> Iterator[T]:
    """Every item after ``start``, read ``chunk`` at a time by ``fetch(after, limit)`` (items ordered
    by ``key``) and only as far as the caller iterates."""
    while True:
        batch = fetch(start, chunk)
        yield from batch
        if len(batch) < chunk:
            return
        start = key(batch[-1])


def take(
    items: Iterable[T],
    request: PageRequest,
    key: Callable[[T], str],
    encode: Callable[[T], M],
    max_bytes: int = MAX_PAGE_BYTES,
) -> Page[M]:
    """One page of ``items`` (ordered by ``key``, all after ``request.after``): at most
    ``request.size`` items, encoded by ``encode`` (only those on the page), stopping before the
    encoded page would pass ``max_bytes``; the token of the next page if anything is left."""
    page: list[M] = []
    used = 0
    last = ""
    for item in items:
        if len(page) == request.size:
            return Page(page, request.token_after(last))
        message = encode(item)
        size = _field_bytes(message)
        if page and used + size > max_bytes:
            return Page(page, request.token_after(last))
        page.append(message)
        used += size
        last = key(item)
    return Page(page, "")


def _field_bytes(message: Message) -> int:
    """What ``message`` adds to a response as one element of a repeated field (tag and length too)."""
    size = message.ByteSize()
    return 1 + _varint_bytes(size) + size


def _varint_bytes(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _digest(method: str, fields: dict[str, object]) -> str:
    text = json.dumps([method, sorted(fields.items())], separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _check(query: str, after: str) -> str:
    return hashlib.sha256(f"{query}\0{after}".encode()).hexdigest()[:32]


__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_BYTES",
    "MAX_PAGE_SIZE",
    "MAX_PAGE_TOKEN_BYTES",
    "Page",
    "PageRequest",
    "after",
    "keyset",
    "page_size_of",
    "take",
]
