"""Controller settings (from ``tether-controller serve`` flags)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tether.controller.limits import ENROLL_RATE_PER_SECOND, NODE_OUTPUT_BYTES_PER_SECOND
from tether.nodeagent.limits import MAX_DOCUMENT_BYTES


@dataclass(frozen=True)
class ControllerConfig:
    data_dir: Path
    listen: str = "127.0.0.1:7443"
    advertise: str = ""  # address agents are told to use (default: the listen address)
    extra_sans: tuple[str, ...] = field(default=())
    heartbeat_seconds: int = 30
    node_cert_days: float = 30.0
    log_level: str = "info"
    # A node that has not streamed for this long counts as offline even if a stream looks open.
    offline_after_seconds: float = 90.0
    # An environment document larger than this is refused (the receive limit follows it).
    max_document_bytes: int = MAX_DOCUMENT_BYTES
    # Enrollments accepted per second, all callers together (the anonymous identity is public).
    enroll_rate_per_second: float = ENROLL_RATE_PER_SECOND
    # Output stored per node and second (bursts of at least NODE_OUTPUT_BURST_BYTES); the rest summarised.
    node_output_bytes_per_second: float = NODE_OUTPUT_BYTES_PER_SECOND
    # Agent bundles of other versions (``tether-agent-<version>.tar.gz``; default DATA_DIR/agent-bundles)
    # and the platform the controller's own version is built for ("3.11/amd64"; default its own).
    agent_bundles_dir: Path | None = None
    agent_platform: str = ""
    # HOST:PORT of the plain-HTTP listener for /metrics, /healthz and /readyz ("": none).
    metrics_listen: str = ""
    # Where the state lives (--store): a postgresql:// URL (replicas share it) or a SQLite file;
    # "": DATA_DIR/tether.db.
    store: str = ""
    # The key-encryption key (--store-key-file): the CA, secret box key and admin registry then live
    # in the store, sealed with it (tether.controller.identity). None: files in DATA_DIR/pki (SQLite).
    store_key_file: Path | None = None
