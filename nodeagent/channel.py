"""gRPC channels to the controller: mutual TLS, pinned CA, keepalive, the shared message limits."""

from __future__ import annotations

import grpc

from tether.nodeagent.identity import CONTROLLER_SERVER_NAME
from tether.nodeagent.limits import client_options

KEEPALIVE_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.enable_retries", 0),
    # Our own backoff decides when to reconnect; gRPC's would double it.
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 5_000),
]


def secure_channel(address: str, ca_pem: bytes, key_pem: bytes, cert_pem: bytes) -> grpc.aio.Channel:
    """A channel that trusts only the controller CA and presents this client's certificate."""
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem
    )
    options = [
        *KEEPALIVE_OPTIONS,
        *client_options(),  # it can receive whatever the controller may send
        ("grpc.ssl_target_name_override", CONTROLLER_SERVER_NAME),
    ]
    return grpc.aio.secure_channel(address, creds, options=options)
