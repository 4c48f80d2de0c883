"""Paging (AIP-158): page sizes, the byte bound, opaque page tokens and a bad token."""

from __future__ import annotations

import base64
import json

import pytest

from tether.controller import paging, wire
from tether.controller.errors import InvalidArgument
from tether.controller.paging import PageRequest


def node(name: str, padding: int = 0) -> wire.admin.Node:
    return wire.admin.Node(name=name, plan_digest="x" * padding)


def names(n: int) -> list[str]:
    return [f"node-{i:05d}" for i in range(n)]


def key(name: str) -> str:
    return name


def every_page(items: list[str], page_size: int, padding: int = 0) -> list[list[str]]:
    """Page through ``items`` the way a client does: token to token until it is empty."""
    pages, token = [], ""
    while True:
        request = PageRequest.parse("ListNodes", page_size, token, environment="lab")
        page = paging.take(paging.after(items, request.after, key), request, key, lambda n: node(n, padding))
        pages.append([m.name for m in page.items])
        token = page.next_page_token
        if not token:
            return pages
        assert len(pages) < 1000, "paging does not end"


def test_page_sizes_default_and_maximum() -> None:
    assert paging.page_size_of(0) == paging.DEFAULT_PAGE_SIZE == 100
    assert paging.page_size_of(7) == 7
    assert paging.page_size_of(10**6) == paging.MAX_PAGE_SIZE == 1000
    assert PageRequest.parse("ListNodes", 0, "").size == 100


def test_pages_hold_every_item_once_in_order() -> None:
    items = names(250)
    pages = every_page(items, 100)
    assert [len(p) for p in pages] == [100, 100, 50]
    assert [n for p in pages for n in p] == items
    assert [len(p) for p in every_page(items, 0)] == [100, 100, 50]  # the default
    assert [len(p) for p in every_page(items[:100], 100)] == [100]  # full, yet the last: no token
    assert every_page([], 100) == [[]]


def test_a_page_stops_before_it_passes_the_byte_bound() -> None:
    big = 300 * 1024  # 7 of these pass 2 MiB, 6 do not
    pages = every_page(names(20), 100, padding=big)
    assert [len(p) for p in pages] == [6, 6, 6, 2]
    request = PageRequest.parse("ListNodes", 100, "", environment="lab")
    page = paging.take(iter(names(20)), request, key, lambda n: node(n, big))
    assert sum(m.ByteSize() for m in page.items) < paging.MAX_PAGE_BYTES
    response = wire.admin.ListNodesResponse(nodes=page.items, next_page_token=page.next_page_token)
    assert response.ByteSize() <= paging.MAX_PAGE_BYTES + 1024  # the token is all that is added


def test_one_item_larger_than_the_bound_still_makes_a_page() -> None:
    huge = paging.MAX_PAGE_BYTES + 1
    assert every_page(names(3), 100, padding=huge) == [["node-00000"], ["node-00001"], ["node-00002"]]


def test_keyset_reads_only_as_far_as_the_page_goes() -> None:
    items = names(10_000)
    asked: list[tuple[str, int]] = []

    def fetch(after: str, limit: int) -> list[str]:
        asked.append((after, limit))
        return [n for n in items if n > after][:limit]

    request = PageRequest.parse("ListNodes", 100, "")
    page = paging.take(paging.keyset(fetch, request.after, request.size + 1, key), request, key, node)
    assert len(page.items) == 100 and asked == [("", 101)]
    following = PageRequest.parse("ListNodes", 100, page.next_page_token)
    assert following.after == "node-00099"
    page = paging.take(paging.keyset(fetch, following.after, 3, key), following, key, node)
    assert [m.name for m in page.items][:2] == ["node-00100", "node-00101"] and len(asked) == 1 + 34


def test_a_filter_between_store_and_page_keeps_pages_full() -> None:
    """A scoped caller's filter (an ``allowed`` predicate) drops items; pages still fill."""
    items = names(1000)
    allowed = [n for n in items if int(n[-1]) % 2 == 0]
    pages, token = [], ""
    while True:
        request = PageRequest.parse("ListNodes", 100, token)
        visible = (n for n in paging.after(items, request.after, key) if int(n[-1]) % 2 == 0)
        page = paging.take(visible, request, key, node)
        pages.append([m.name for m in page.items])
        token = page.next_page_token
        if not token:
            break
    assert [len(p) for p in pages] == [100] * 5 and [n for p in pages for n in p] == allowed


def test_a_token_is_opaque_and_bound_to_the_request() -> None:
    request = PageRequest.parse("ListNodes", 10, "", environment="lab")
    token = request.token_after("node-00009")
    assert "node-00009" not in token  # opaque (base64), though not secret
    assert PageRequest.parse("ListNodes", 50, token, environment="lab").after == "node-00009"  # any size
    for method, env in (("ListNodes", "other"), ("ListTokens", "lab"), ("ListNodes", "")):
        with pytest.raises(InvalidArgument, match="page_token is not valid"):
            PageRequest.parse(method, 10, token, environment=env)


def _b64(doc: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()


@pytest.mark.parametrize(
    "bad",
    [
        "garbage!!",
        "%%%%",
        base64.urlsafe_b64encode(b"\xff\xfe not json").decode(),
        _b64(["after", "q"]),
        _b64({"after": "", "q": "x"}),
        _b64({"after": 5, "q": "x"}),
        "A" * (paging.MAX_PAGE_TOKEN_BYTES + 4),
    ],
)
def test_garbage_tokens_are_invalid_argument(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="page_token is not valid"):
        PageRequest.parse("ListNodes", 10, bad, environment="lab")


def test_a_changed_token_is_invalid_argument() -> None:
    token = PageRequest.parse("ListNodes", 10, "").token_after("node-00009")
    doc = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    doc["after"] = "node-00500"  # skip ahead by editing the cursor
    with pytest.raises(InvalidArgument):
        PageRequest.parse("ListNodes", 10, _b64(doc))
    flipped = ("B" if token[0] != "B" else "C") + token[1:]
    with pytest.raises(InvalidArgument):
        PageRequest.parse("ListNodes", 10, flipped)
