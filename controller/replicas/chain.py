"""A check-and-set across replicas on a store whose only atomic step is ``kv_put_if_absent``.

A value that replicas change after checking it (a join slot, the owner of a DNS name) is kept as a
chain of records: each new record is put, if absent, under the key named after the record it
follows. Two replicas that both find the same record acceptable to follow race for one key: one
wins; the other is handed the winner's record and checks that instead. A replica whose view of the
store lags starts from an older record and is led along the chain to the last one. The caller keeps
the latest record under a key of its own too, as the hint to start from next time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Protocol

MAX_STEPS = 64


class PutIfAbsent(Protocol):
    async def kv_put_if_absent(self, key: str, value: bytes) -> bytes: ...


def next_key(prefix: str, raw: bytes | None) -> str:
    """The key of the record that follows ``raw`` (None: the chain's first)."""
    return f"{prefix}-next/{hashlib.sha256(raw or b'').hexdigest()[:32]}"


async def append(
    store: PutIfAbsent,
    prefix: str,
    hint: bytes | None,
    record: bytes,
    may_follow: Callable[[bytes | None], bool],
) -> tuple[bool, bytes | None]:
    """Put ``record`` after the chain's last record, if ``may_follow`` accepts that one; from
    ``hint`` (a record of the chain, or None for its start). Returns (appended, the last record).
    ``record`` must differ from every record before it (put a nonce in it)."""
    raw = hint
    for _ in range(MAX_STEPS):
        if not may_follow(raw):
            return False, raw
        won = await store.kv_put_if_absent(next_key(prefix, raw), record)
        if won == record:
            return True, record
        raw = won  # another replica moved it on: check what it put
    return False, raw
