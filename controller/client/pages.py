"""Paging iterators: every item of a paged list call (AIP-158), one page fetched at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R", bound="PagedResponse")


class PagedResponse(Protocol):
    @property
    def next_page_token(self) -> str: ...


def pages(fetch: Callable[[str], R]) -> Iterator[R]:
    """Every page: ``fetch(page_token)`` with "" first, then with each page's next_page_token."""
    token = ""
    while True:
        page = fetch(token)
        yield page
        if not page.next_page_token:
            return
        if page.next_page_token == token:  # a server that pages no further: stop, never spin
            raise RuntimeError("the controller returned the same page token twice")
        token = page.next_page_token


def items(fetch: Callable[[str], R], of: Callable[[R], Iterable[T]]) -> Iterator[T]:
    """Every item of every page, in order; the next page is asked for once these run out."""
    for page in pages(fetch):
        yield from of(page)
