"""The controller's gRPC server options (a module of its own: bench/bare.py uses them without
importing the rest of the controller)."""

from __future__ import annotations

from tether.nodeagent.limits import MAX_DOCUMENT_BYTES, MAX_SEND_BYTES, receive_bytes

_BASE_OPTIONS: list[tuple[str, int]] = [
    ("grpc.so_reuseport", 0),  # a second controller on the same port must fail, not share it
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
]


def server_options(max_document_bytes: int = MAX_DOCUMENT_BYTES) -> list[tuple[str, int]]:
    """Options for a controller whose environment documents may be ``max_document_bytes`` long."""
    return [
        *_BASE_OPTIONS,
        ("grpc.max_receive_message_length", receive_bytes(max_document_bytes)),
        ("grpc.max_send_message_length", MAX_SEND_BYTES),
    ]


SERVER_OPTIONS = server_options()
