"""Progress messages of the testbed: stderr, one line each, so the CLI's stdout stays pure JSON."""

from __future__ import annotations

import sys
import time

_START = time.monotonic()


def info(message: str) -> None:
    print(f"[testbed {time.monotonic() - _START:6.1f}s] {message}", file=sys.stderr, flush=True)
