"""Environment documents as the controller takes them: the size first, then parsed off the event loop.

``check_size`` is the one size check (the controller's ApplyEnvironment and tetherctl's
``env validate`` / ``env apply`` call it with the same number); ``DocumentParser`` parses in a
worker thread, a few at a time, so that a large document never stalls other calls.
"""

from __future__ import annotations

import asyncio

from tether.controller.errors import InvalidArgument
from tether.controller.limits import DOCUMENT_PARSES
from tether.controller.spec import LoadedSpec, load_document
from tether.nodeagent.limits import MAX_DOCUMENT_BYTES, KiB, size_text


def _size_text(size: int) -> str:
    """``1.5 MiB (1572864 bytes)``; a size under 1 KiB in bytes only."""
    return size_text(size) if size < KiB else f"{size_text(size)} ({size} bytes)"


def check_size(document: str, limit: int = MAX_DOCUMENT_BYTES) -> None:
    """Raise ``InvalidArgument`` (one line: the size and the limit) for a document over ``limit``."""
    size = len(document.encode())
    if size > limit:
        raise InvalidArgument(
            f"environment document is {_size_text(size)}, over the limit of {_size_text(limit)}"
        )


class DocumentParser:
    """``await parse(document)``: size-checked, then ``load_document`` in a worker thread."""

    def __init__(self, limit: int = MAX_DOCUMENT_BYTES, at_once: int = DOCUMENT_PARSES) -> None:
        self.limit = limit
        self._slots = asyncio.Semaphore(at_once)

    async def parse(self, document: str) -> LoadedSpec:
        check_size(document, self.limit)
        async with self._slots:
            return await asyncio.to_thread(load_document, document)
