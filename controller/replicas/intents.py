"""What one replica asks the replica holding a node's stream to do (``delivery``), as small JSON.

An intent never carries a secret: a plan is named by its generation and digest (the holder renders
it from the shared store), a join-material refresh by its environment (the holder asks with its
own unguessable command id); only messages that hold nothing secret travel whole (notices,
reruns, reboots, kubectl and list tasks, releases without secret values), as compressed protobuf.
Intents are packed into payloads of at most ``PAYLOAD_BYTES`` (``Store.publish``'s limit).
"""

from __future__ import annotations

import base64
import json
import zlib
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from tether.controller import wire

PAYLOAD_BYTES = 3800  # a whole notice (envelope, topic, MAC: pgsync) stays within 4000 bytes
MESSAGE = "m"  # a whole ControllerMessage (nothing secret in it)
PLAN = "p"  # render and send the node's plan of generation ``g`` (digest ``d``)
REFRESH = "r"  # ask the node for fresh join material of environment ``e``
NEVER_FORWARDED = ("refresh-",)  # command ids that are capabilities: answered only where sent


@dataclass(frozen=True)
class Intent:
    node: str
    kind: str
    fields: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"n": self.node, "k": self.kind, **self.fields}

    @staticmethod
    def from_json(doc: dict[str, Any]) -> Intent:
        fields = {k: v for k, v in doc.items() if k not in ("n", "k")}
        return Intent(str(doc["n"]), str(doc["k"]), fields)


def travels(msg: wire.agent.ControllerMessage) -> bool:
    """Whether ``msg`` may be handed whole to another replica: nothing secret, no capability, not
    an answer on one stream. The receiver checks it again (a message intent is only ever these)."""
    kind = msg.WhichOneof("kind")
    if kind == "release" and msg.release.secret_env:
        return False  # join material: the holder's own waiter gets it from the store
    if kind == "command" and msg.command.id.startswith(NEVER_FORWARDED):
        return False
    return kind in ("notice", "command", "release")  # not acks, welcomes, settings, certificates


def for_message(node: str, msg: wire.agent.ControllerMessage) -> Intent | None:
    """The intent that hands ``msg`` to ``node`` on another replica; None when it may not travel
    (a secret, a capability, a message only its own stream can answer with, or too large)."""
    if msg.WhichOneof("kind") == "plan":
        return Intent(node, PLAN, {"g": msg.plan.generation, "d": msg.plan.digest})
    if not travels(msg):
        return None
    packed = base64.b64encode(zlib.compress(msg.SerializeToString(), 6)).decode()
    intent = Intent(node, MESSAGE, {"b": packed})
    return intent if len(json.dumps(intent.to_json())) <= PAYLOAD_BYTES else None


def refresh(node: str, environment: str, cert_key: bool) -> Intent:
    return Intent(node, REFRESH, {"e": environment, "c": cert_key})


def message_of(intent: Intent) -> wire.agent.ControllerMessage | None:
    """The message a MESSAGE intent carries; None unless it is one ``for_message`` may send."""
    try:
        raw = zlib.decompress(base64.b64decode(str(intent.fields["b"]), validate=True))
        msg = wire.agent.ControllerMessage.FromString(raw)
    except (KeyError, ValueError, zlib.error, DecodeError):
        return None
    return msg if travels(msg) else None


def pack(intents: list[Intent], limit: int = PAYLOAD_BYTES) -> list[str]:
    """``intents`` as JSON lists, in order, each at most ``limit`` bytes."""
    payloads: list[str] = []
    batch: list[str] = []
    size = 2
    for intent in intents:
        item = json.dumps(intent.to_json(), separators=(",", ":"))
        if batch and size + len(item) + 1 > limit:
            payloads.append("[" + ",".join(batch) + "]")
            batch, size = [], 2
        batch.append(item)
        size += len(item) + 1
    if batch:
        payloads.append("[" + ",".join(batch) + "]")
    return payloads


def unpack(payload: str) -> list[Intent]:
    """The intents of one payload (one that does not parse: none)."""
    try:
        docs = json.loads(payload)
        return [Intent.from_json(d) for d in docs if isinstance(d, dict)]
    except (ValueError, KeyError, TypeError):
        return []
