"""The controller's gRPC server options (a module of its own: bench/bare.py uses them without
importing the rest of the controller)."""

from __future__ import annotations

SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.so_reuseport", 0),  # a second controller on the same port must fail, not share it
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]
