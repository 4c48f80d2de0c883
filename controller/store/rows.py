"""Rows <-> records, shared by the backends (same columns, same JSON text in both)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tether.controller.store.records import EnvironmentRecord, NodeRecord, StepRecord
from tether.controller.tokens import TokenRecord
from tether.nodeagent.model import Event, EventKind

ENV_COLUMNS = "name, document, api_version, spec, generation, created_ms, updated_ms, agent_version"
_TOKEN_FIELDS = "id, secret_hash, environment, role, node_name, expires_ms, max_uses, uses, revoked"  # noqa: S105
TOKEN_COLUMNS = _TOKEN_FIELDS + ", created_ms, description"
NODE_COLUMNS = (
    "name, environment, role, cert_fingerprint, key_hash, token_id, enrolled_ms, revoked, facts, health, "
    "last_seen_ms, agent_version, plan_generation, plan_digest, stored_seq, prev_fingerprint, "
    "agent_rolled_back_from, hardware"
)
NODE_COLUMN_COUNT = 18
STEP_COLUMNS = (
    "node, ordinal, name, digest, state, component, continue_on_error, exit_code, attempt, updated_ms, "
    "message, observed"
)
AUDIT_COLUMNS = (
    "time_ms, admin, fingerprint, method, environment, node, generation_before, generation_after, "
    "outcome, detail"
)

NODE_FIELDS = frozenset(
    {
        "environment",
        "role",
        "cert_fingerprint",
        "prev_fingerprint",
        "key_hash",
        "token_id",
        "enrolled_ms",
        "revoked",
        "facts",
        "health",
        "last_seen_ms",
        "agent_version",
        "agent_rolled_back_from",
        "hardware",
        "plan_generation",
        "plan_digest",
    }
)

STEP_STATE_BY_KIND = {
    EventKind.STARTED: "running",
    EventKind.WAITING: "waiting",
    EventKind.SUCCEEDED: "succeeded",
    EventKind.FAILED: "failed",
    EventKind.SKIPPED: "skipped",
}


def env_record(row: Sequence[Any]) -> EnvironmentRecord:
    name, document, api_version, spec, generation, created, updated, agent_version = row
    return EnvironmentRecord(
        name, document, api_version, json.loads(spec), generation, created, updated, agent_version
    )


def token_record(row: Sequence[Any]) -> TokenRecord:
    (tid, secret_hash, env, role, node_name, expires, max_uses, uses, revoked, created, desc) = row
    return TokenRecord(
        tid, secret_hash, env, role, node_name, expires, max_uses, uses, bool(revoked), created, desc
    )


def node_record(row: Sequence[Any]) -> NodeRecord:
    (name, env, role, fp, key_hash, token_id, enrolled, revoked, facts, health) = row[:10]
    (last_seen, version, generation, digest, stored_seq, prev_fp, rolled_back_from, hardware) = row[10:18]
    return NodeRecord(
        name=name,
        environment=env,
        role=role,
        cert_fingerprint=fp,
        key_hash=key_hash,
        token_id=token_id,
        enrolled_ms=enrolled,
        revoked=bool(revoked),
        facts=json.loads(facts),
        health=json.loads(health),
        last_seen_ms=last_seen,
        agent_version=version,
        plan_generation=generation,
        plan_digest=digest,
        stored_seq=stored_seq,
        prev_fingerprint=prev_fp,
        agent_rolled_back_from=rolled_back_from,
        hardware=json.loads(hardware),
    )


def node_values(record: NodeRecord, hardware: str) -> tuple[Any, ...]:
    """A ``nodes`` row in NODE_COLUMNS order (``revoked`` a bool: the SQLite backend stores it as 0/1)."""
    return (
        record.name,
        record.environment,
        record.role,
        record.cert_fingerprint,
        record.key_hash,
        record.token_id,
        record.enrolled_ms,
        record.revoked,
        json.dumps(dict(record.facts)),
        json.dumps(dict(record.health)),
        record.last_seen_ms,
        record.agent_version,
        record.plan_generation,
        record.plan_digest,
        record.stored_seq,
        record.prev_fingerprint,
        record.agent_rolled_back_from,
        hardware,
    )


def token_values(record: TokenRecord) -> tuple[Any, ...]:
    """A ``tokens`` row in TOKEN_COLUMNS order (``revoked`` a bool)."""
    return (
        record.id,
        record.secret_hash,
        record.environment,
        record.role,
        record.node_name,
        record.expires_ms,
        record.max_uses,
        record.uses,
        record.revoked,
        record.created_ms,
        record.description,
    )


def step_record(r: Sequence[Any]) -> StepRecord:
    return StepRecord(
        node=r[0],
        ordinal=r[1],
        name=r[2],
        digest=r[3],
        state=r[4],
        component=r[5],
        continue_on_error=bool(r[6]),
        exit_code=r[7],
        attempt=r[8],
        updated_ms=r[9],
        message=r[10],
        observed=json.loads(r[11]),
    )


def encode_json(value: Any) -> Any:
    """A node field as stored: dicts and lists as JSON text, the rest as they are."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return value


def event_row(node: str, e: Event) -> tuple[str, int, int, int, str, str]:
    """An ``events`` row: (node, seq, time, kind, step, the event as JSON)."""
    return (node, e.seq, e.time_ms, int(e.kind), e.step, json.dumps(e.to_json(), separators=(",", ":")))


def step_updates(node: str, events: Sequence[Event]) -> list[tuple[Any, ...]]:
    """The node_steps updates ``events`` make: (state, exit_code, attempt, updated_ms, message,
    observed JSON or None, node, step, digest), in order."""
    updates = []
    for e in events:
        state = "retrying" if e.kind is EventKind.FAILED and e.will_retry else STEP_STATE_BY_KIND.get(e.kind)
        if state is None or not e.step:
            continue
        observed = json.dumps(dict(e.observed), sort_keys=True) if e.observed else None
        updates.append(
            (state, e.exit_code, e.attempt, e.time_ms, e.message, observed, node, e.step, e.digest)
        )
    return updates


def plan_step_rows(
    name: str, plan_steps: Sequence[Any], old: dict[str, Sequence[Any]]
) -> list[tuple[Any, ...]]:
    """node_steps rows for a new plan: a step whose digest did not change keeps its state (``old``:
    name -> (name, digest, state, exit_code, attempt, updated_ms, message, observed))."""
    rows = []
    for i, step in enumerate(plan_steps):
        prev = old.get(step.name)
        if prev is not None and prev[1] == step.digest:
            state, exit_code, attempt, updated, message, observed = prev[2:]
        else:
            state, exit_code, attempt, updated, message, observed = "pending", 0, 0, 0, "", "{}"
        rows.append(
            (
                name,
                i,
                step.name,
                step.digest,
                state,
                step.component,
                bool(step.continue_on_error),
                exit_code,
                attempt,
                updated,
                message,
                observed,
            )
        )
    return rows
