"""Rows the store hands out (plain frozen dataclasses, no SQL)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class EnvironmentRecord:
    name: str
    document: str
    api_version: str
    spec: Mapping[str, Any]
    generation: int
    created_ms: int
    updated_ms: int
    agent_version: str = ""  # the agent version its nodes should run ("" = whatever they run)


@dataclass(frozen=True)
class NodeRecord:
    name: str
    environment: str
    role: str
    cert_fingerprint: str
    key_hash: str
    token_id: str
    enrolled_ms: int
    revoked: bool = False
    facts: Mapping[str, Any] = field(default_factory=dict)
    health: Mapping[str, Any] = field(default_factory=dict)
    last_seen_ms: int = 0
    agent_version: str = ""
    plan_generation: int = 0
    plan_digest: str = ""
    stored_seq: int = 0
    prev_fingerprint: str = ""
    # The version its agent went back from by itself after a failed self-upgrade (hello), or "".
    agent_rolled_back_from: str = ""
    # The hardware verdict (tether.controller.hardware): {"quarantine": {...}, "released": {...},
    # "conditions": {...}}; {} when spec.hardware never spoke.
    hardware: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepRecord:
    node: str
    ordinal: int
    name: str
    digest: str
    state: str
    component: str = ""
    continue_on_error: bool = False
    exit_code: int = 0
    attempt: int = 0
    updated_ms: int = 0
    message: str = ""
    observed: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AuditRecord:
    """One mutating admin call (``tether.controller.audit``): who, what, when, how it ended; no secret."""

    id: int  # 0 until stored; then increasing, never reused
    time_ms: int
    admin: str  # the admin certificate's name
    fingerprint: str  # its SHA-256 fingerprint
    method: str  # e.g. ApplyEnvironment
    environment: str = ""
    node: str = ""
    generation_before: int = 0  # environment changes
    generation_after: int = 0
    outcome: str = "ok"  # or the status code's name (PERMISSION_DENIED, ABORTED ...)
    detail: str = ""


ChangeKind = Literal[
    "node", "node_deleted", "environment", "environment_deleted", "token", "kv", "events", "message"
]


@dataclass(frozen=True)
class StoreChange:
    """A change another replica made, handed to ``Store.subscribe`` listeners once the view has it.

    ``kind``: "node" (its record or steps; key = node name), "node_deleted", "environment",
    "environment_deleted", "token" (key = token id), "kv" (key = kv key; also for a delete),
    "events" (key = node, ``seq`` = its highest stored seq now), "message" (key = topic,
    ``payload`` = what ``Store.publish`` sent).
    """

    kind: ChangeKind
    key: str
    seq: int = 0
    payload: str = ""
