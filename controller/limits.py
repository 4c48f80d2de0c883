"""Every limit the controller enforces: one number each, all here (docs/security.md lists them).

Wire sizes shared with the clients live in ``tether.nodeagent.limits``; what follows is the controller's
own: rates, quotas, queue sizes and caches. A limit that an operator may change is a
``ControllerConfig`` field whose default is the number below.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tether.nodeagent.limits import (  # noqa: F401 (re-exported: one import for the controller's code)
    ANONYMOUS_MESSAGE_BYTES,
    ENVELOPE_BYTES,
    EVENT_BATCH_BYTES,
    MAX_DOCUMENT_BYTES,
    MAX_LINE_BYTES,
    MAX_RECEIVE_BYTES,
    MAX_SEND_BYTES,
    KiB,
    MiB,
)

# -- anonymous callers (the enrollment identity is public) -------------------------------------
ANONYMOUS_CONCURRENCY = 16  # anonymous calls in progress at once; more wait, then are refused
ENROLL_RATE_PER_SECOND = 50.0  # enrollments accepted per second, all callers together
ENROLL_BURST = 200
REFUSED_LOG_PER_SECOND = 5.0  # log lines for refused calls (the rest are counted, then summarised)
ANONYMOUS_WAIT_SECONDS = 2.0  # how long an anonymous call over the concurrency waits for a slot

# -- documents ---------------------------------------------------------------------------------
MAX_YAML_DEPTH = 64  # nesting of an environment document
MAX_YAML_NODES = 100_000  # nodes of an environment document, every alias counted at its full size
DOCUMENT_PARSES = 2  # environment documents parsed at once (each in a worker thread)

# -- per node ----------------------------------------------------------------------------------
NODE_OUTPUT_BYTES_PER_SECOND = 64 * KiB  # output stored per node, sustained (about 3.8 MB a minute)
NODE_OUTPUT_BURST_BYTES = 4 * MiB  # on top: a whole provisioning prints 1-10 MB; excess summarised
NODE_EVENTS_PER_SECOND = 1000.0
NODE_EVENTS_BURST = 20_000
NODE_RENEWALS_PER_HOUR = 6.0  # certificate renewals
NODE_CONNECTS_PER_MINUTE = 30.0  # stream (re)opens
# Output over the quota is still read (to summarise it), but no faster than this: backpressure.
NODE_EXCESS_READ_BYTES_PER_SECOND = 4 * MiB
QUOTA_PAUSE_SECONDS = 5.0  # longest pause in reading a node over its output quota

# -- admin side --------------------------------------------------------------------------------
FOLLOWER_QUEUE_BYTES = 8 * MiB  # events queued for one FollowEvents call; over it, it is cut off
PLAN_CACHE_ENTRIES = 256  # rendered plans and plan messages kept
# An open WatchNodes / FollowEvents checks its caller again (revoked? scope changed?) on every
# event and at least this often while idle: a revoked admin's stream ends within about this long.
STREAM_RECHECK_SECONDS = 2.0
# An error's status as sent (message and google.rpc.Status details, encoded): under the 8 KiB
# metadata limit every gRPC client has by default; problems past it are counted, not listed.
ERROR_STATUS_BYTES = 7 * KiB

# Drains around disruptive steps (controller/cluster/drain.py).
DRAIN_TIMEOUT_SECONDS = 300  # kubectl drain --timeout; past it and a grace, the drain counts as failed
DRAIN_MESSAGE_CHARS = 600  # the reason a failed drain gives its gated step, cut to this

# Node resets (controller/resets.py): a reset not reported done by its deadline is given up (the
# node is revoked and forgotten); a forgotten node's stream stays open a moment, so the ack of its
# last report goes out. ``tetherctl node reset --wait`` waits as long as the deadline by default.
RESET_TIMEOUT_SECONDS = 1800
RESET_CLOSE_GRACE_SECONDS = 5.0

# -- metrics listener (``--metrics-listen``) ---------------------------------------------------
METRICS_SCAN_MIN_SECONDS = 2.0  # nodes are counted by state at most this often, however many scrapes
METRICS_PROBE_SECONDS = 2.0  # what a probe waits for the event loop and for the gRPC port
METRICS_REQUEST_TIMEOUT_SECONDS = 10.0  # a metrics client silent this long is disconnected


@dataclass
class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up; ``take`` says whether there were enough."""

    rate: float
    burst: float
    tokens: float = -1.0
    stamp: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.burst

    def take(self, amount: float = 1.0, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= amount:
            self.tokens -= amount
            return True
        return False

    def give_back(self, amount: float = 1.0) -> None:
        """Return what a ``take`` charged for work that did not happen after all."""
        self.tokens = min(self.burst, self.tokens + amount)
