"""YAML parsing with the document limits: nesting depth and node count, aliases at full size.

``yaml.safe_load`` recurses once per nesting level (a 200k-deep ``[[[...]]]`` ends in
``RecursionError``) and shares aliased nodes, so a "billion laughs" document is small to load
but explodes for whoever walks it. Here the composer counts as it goes: a collection deeper
than ``MAX_YAML_DEPTH``, more than ``MAX_YAML_NODES`` nodes (an alias counts as the whole node
it names) or an alias inside the node it names stop the parse at once with ``YamlLimit``. Anchors
are per document, as PyYAML has them: in a stream, an anchor of an earlier document is forgotten.
"""

from __future__ import annotations

from typing import Any

import yaml

from tether.controller.limits import MAX_YAML_DEPTH, MAX_YAML_NODES


class YamlLimit(yaml.YAMLError):
    """The document is over one of the limits; the message is one line saying which."""


class _Loader(yaml.SafeLoader):
    """``SafeLoader`` whose composer tracks depth, expanded node count and open anchors."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0
        self._sizes: dict[str, int] = {}  # anchor -> expanded nodes, once its node is complete

    def compose_document(self) -> yaml.Node | None:
        # PyYAML forgets every anchor at the end of a document, and a later document may define
        # one of the same name again: an anchor's size is known per document (the depth and node
        # counts stay the stream's).
        self._sizes = {}
        return super().compose_document()

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)  # an undefined alias is a ComposerError
            size = self._sizes.get(event.anchor or "")
            if size is None:
                raise YamlLimit(f"alias *{event.anchor} is inside the node it names (an endless document)")
            self._count(size)
            return node
        nested = isinstance(event, yaml.CollectionStartEvent)
        if nested:
            self._depth += 1
            if self._depth > MAX_YAML_DEPTH:
                raise YamlLimit(f"nested deeper than {MAX_YAML_DEPTH} levels (the limit)")
        start = self._nodes
        try:
            node = super().compose_node(parent, index)
        finally:
            if nested:
                self._depth -= 1
        self._count(1)
        if isinstance(event, yaml.NodeEvent) and event.anchor is not None:
            self._sizes[event.anchor] = self._nodes - start
        return node

    def _count(self, nodes: int) -> None:
        self._nodes += nodes
        if self._nodes > MAX_YAML_NODES:
            raise YamlLimit(f"more than {MAX_YAML_NODES} nodes, aliases expanded (the limit)")


def load_all(text: str) -> list[Any]:
    """Every document in ``text`` (a ``---``-separated stream), as ``yaml.safe_load_all`` gives
    them; the limits apply to the whole stream (the node count is the stream's, not each
    document's). Raises like ``load``."""
    loader = _Loader(text)
    docs: list[Any] = []
    try:
        while loader.check_data():  # type: ignore[no-untyped-call]
            docs.append(loader.get_data())
    except (ValueError, OverflowError) as exc:
        raise yaml.YAMLError(f"a value cannot be read: {exc}") from None
    finally:
        loader.dispose()
    return docs


def load(text: str) -> Any:
    """The one document in ``text``, as ``yaml.safe_load`` gives it, within the limits.

    Raises ``YamlLimit`` over a limit and ``yaml.YAMLError`` for text that is not YAML; a scalar
    the safe constructor cannot build (``2001-13-45``, an int of 5,000 digits) is a
    ``yaml.YAMLError`` too, never a bare ``ValueError``.
    """
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    except (ValueError, OverflowError) as exc:
        raise yaml.YAMLError(f"a value cannot be read: {exc}") from None
    finally:
        loader.dispose()
