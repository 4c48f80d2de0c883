"""Wire limits shared by the agent, tetherctl and the controller: one number each.

docs/security.md lists every limit with its default and where it is enforced. The agent
imports only this module (never ``tether.controller.limits``); the controller builds its own on it.
"""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB

# What the controller may send in one message (a plan, an event page, a node list); every
# client (agent, tetherctl, the bootstrap) is built to receive at least this much.
MAX_SEND_BYTES = 64 * MiB
# An environment document: refused at validate and apply above this (controller: configurable).
MAX_DOCUMENT_BYTES = 1 * MiB
# One batch of events on the agent's stream, encoded; well below the controller's receive limit.
EVENT_BATCH_BYTES = 512 * KiB
EVENT_BATCH_COUNT = 500
# One output line as it leaves the node; a longer one is cut and says so.
MAX_LINE_BYTES = 8 * KiB
# What one step may hand back as secrets and outputs (join material, a kubeconfig), in all.
STEP_SECRETS_BYTES = 256 * KiB
# Envelope room on top of the largest legitimate payload (field tags, the other fields).
ENVELOPE_BYTES = 64 * KiB


def receive_bytes(max_document_bytes: int = MAX_DOCUMENT_BYTES) -> int:
    """What the controller accepts in one message: the largest legitimate one plus its envelope."""
    return max(max_document_bytes, EVENT_BATCH_BYTES) + ENVELOPE_BYTES


MAX_RECEIVE_BYTES = receive_bytes()  # with the default document limit
# Enroll and every other call open to the public anonymous enrollment identity.
ANONYMOUS_MESSAGE_BYTES = 64 * KiB


def client_options() -> list[tuple[str, int]]:
    """gRPC channel options every tether client uses: it can receive whatever the controller sends."""
    return [
        ("grpc.max_receive_message_length", MAX_SEND_BYTES),
        ("grpc.max_send_message_length", MAX_SEND_BYTES),
    ]


def size_text(size: int) -> str:
    """``1.5 MiB``, ``4.4 KiB``, ``8 MiB``, ``90 bytes``: a size as the messages say it."""
    for unit, name in ((MiB, "MiB"), (KiB, "KiB")):
        if size >= unit:
            return f"{f'{size / unit:.1f}'.removesuffix('.0')} {name}"
    return f"{size} bytes"


# Agent upgrades (docs/agent-upgrades.md): one FetchAgentBundle chunk, the largest bundle an agent
# downloads and stages, how long a new version has to connect and report health before the node
# goes back to the old one, and how many starts it gets to do so.
AGENT_BUNDLE_CHUNK_BYTES = 1 * MiB
AGENT_BUNDLE_MAX_BYTES = 512 * MiB
UPGRADE_DEADLINE_SECONDS = 300
UPGRADE_MAX_STARTS = 3

# A reset (nodeagent/deprovision.py): how long the agent waits for the controller to hold its "reset
# done" report before it removes itself anyway.
RESET_REPORT_SECONDS = 60.0

# A controller Notice recorded as an INFO event: its message is cut to this many characters, its
# step name and digest to MAX_NOTICE_STEP (a notice is one line, never an output dump).
MAX_NOTICE_MESSAGE = 2000
MAX_NOTICE_STEP = 128
