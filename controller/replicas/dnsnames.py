"""A new environment claims its DNS-safe name in the store before it is written.

``a_b`` and ``a-b`` would be the same cluster name, so a new environment's DNS name must be free;
one process checks and writes under a lock, but replicas sharing a store could each check, find
it free and write. So the check-and-write is a claim: ``dns-name/<name>`` records which
environment owns it, changed only through ``replicas.chain`` (of two replicas claiming it at
once, one wins). The claim goes when its environment is deleted (or its write failed); a claim
whose environment does not exist after ``ORPHAN_SECONDS`` (its replica died mid-apply) is free.
"""

from __future__ import annotations

import json
import secrets
from typing import Protocol

from tether.controller.replicas import chain
from tether.controller.spec import names
from tether.controller.store.records import EnvironmentRecord
from tether.nodeagent.model import now_ms

PREFIX = "dns-name/"
ORPHAN_SECONDS = 60.0


class ClaimStore(chain.PutIfAbsent, Protocol):
    def kv_get(self, key: str) -> bytes | None: ...
    async def kv_put(self, key: str, value: bytes) -> None: ...
    def get_environment(self, name: str) -> EnvironmentRecord | None: ...


def _record(environment: str) -> bytes:
    doc = {"environment": environment, "since_ms": now_ms(), "nonce": secrets.token_hex(8)}
    return json.dumps(doc, sort_keys=True).encode()


def _owner(raw: bytes | None) -> str:
    return str(json.loads(raw).get("environment", "")) if raw else ""


def _free_for(store: ClaimStore, environment: str, raw: bytes | None) -> bool:
    owner = _owner(raw)
    if owner in ("", environment):
        return True
    if store.get_environment(owner) is not None:
        return False
    since = int(json.loads(raw or b"{}").get("since_ms", 0))
    return now_ms() - since > ORPHAN_SECONDS * 1000  # its environment was never written


async def claim(store: ClaimStore, environment: str) -> str:
    """Claim ``environment``'s DNS name for it: "" when it has it now, else the environment that
    owns it (being created through another replica, or existing)."""
    key = PREFIX + names.dns_name(environment)
    won, last = await chain.append(
        store, key, store.kv_get(key), _record(environment), lambda raw: _free_for(store, environment, raw)
    )
    if not won:
        return _owner(last)
    await store.kv_put(key, last or b"")
    return ""


async def release(store: ClaimStore, environment: str) -> None:
    """``environment`` is gone (or was never written): its DNS name is free again."""
    key = PREFIX + names.dns_name(environment)
    freed, last = await chain.append(
        store, key, store.kv_get(key), _record(""), lambda raw: _owner(raw) == environment
    )
    if freed:
        await store.kv_put(key, last or b"")
