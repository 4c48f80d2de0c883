"""Per-node quotas: stored output bytes, events, certificate renewals and stream (re)opens.

One set of token buckets per node name, kept for the life of the process (a re-opened stream
does not refill them). Output over its quota is summarised, never stored: the event keeps its
number, kind and step (so sequence numbers stay contiguous and step states stay right) and its
lines become one marker line that says what was dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from tether.controller.limits import (
    NODE_CONNECTS_PER_MINUTE,
    NODE_EVENTS_BURST,
    NODE_EVENTS_PER_SECOND,
    NODE_EXCESS_READ_BYTES_PER_SECOND,
    NODE_OUTPUT_BURST_BYTES,
    NODE_OUTPUT_BYTES_PER_SECOND,
    NODE_RENEWALS_PER_HOUR,
    QUOTA_PAUSE_SECONDS,
    TokenBucket,
)
from tether.nodeagent.limits import size_text
from tether.nodeagent.model import Event

MAX_STEP_NAME = 253  # what a summarised event keeps of its step name and digest
MAX_DIGEST = 64
QUOTA_MARKER = "[tether: {lines} lines, {size} of output dropped: node over its output quota]"


def event_bytes(e: Event) -> int:
    """What storing ``e``'s free text costs (lines, message, observed values, its step's name and
    digest: each is stored, so each is charged)."""
    return (
        sum(len(line) for line in e.lines)
        + len(e.message)
        + sum(len(k) + len(v) for k, v in e.observed.items())
        + len(e.step)
        + len(e.digest)
    )


@dataclass
class Charged:
    """A batch after its quotas: the events to store, and how far over the quotas it went."""

    events: list[Event]
    summarised: int = 0  # events whose output was replaced by the marker
    over_bytes: int = 0  # output dropped
    over_events: int = 0  # events past the events quota


def summarised(e: Event) -> Event:
    """``e`` with its output replaced by one marker line (everything else kept)."""
    marker = QUOTA_MARKER.format(lines=len(e.lines), size=size_text(event_bytes(e)))
    return replace(
        e,
        step=e.step[:MAX_STEP_NAME],
        digest=e.digest[:MAX_DIGEST],
        lines=(marker,),
        message=marker if e.message else "",
        observed={},
    )


@dataclass
class NodeBuckets:
    output: TokenBucket = field(
        default_factory=lambda: TokenBucket(NODE_OUTPUT_BYTES_PER_SECOND, NODE_OUTPUT_BURST_BYTES)
    )
    events: TokenBucket = field(
        default_factory=lambda: TokenBucket(NODE_EVENTS_PER_SECOND, NODE_EVENTS_BURST)
    )
    renewals: TokenBucket = field(
        default_factory=lambda: TokenBucket(NODE_RENEWALS_PER_HOUR / 3600.0, max(1.0, NODE_RENEWALS_PER_HOUR))
    )
    connects: TokenBucket = field(
        default_factory=lambda: TokenBucket(
            NODE_CONNECTS_PER_MINUTE / 60.0, max(1.0, NODE_CONNECTS_PER_MINUTE)
        )
    )


def retry_after(bucket: TokenBucket, amount: float = 1.0) -> float:
    """Seconds until ``bucket`` holds ``amount`` again (after a refused ``take``)."""
    return max(0.0, (amount - bucket.tokens) / bucket.rate) if bucket.rate > 0 else float("inf")


class NodeQuotas:
    """The buckets of every node that has used any; ``apply``/``renewal``/``connect`` charge them."""

    def __init__(self, output_rate: float = NODE_OUTPUT_BYTES_PER_SECOND) -> None:
        self._nodes: dict[str, NodeBuckets] = {}
        self._output_rate = output_rate  # ``tether-controller serve --node-output-rate``

    def buckets(self, node: str) -> NodeBuckets:
        b = self._nodes.get(node)
        if b is None:
            rate = self._output_rate
            output = TokenBucket(rate, max(NODE_OUTPUT_BURST_BYTES, 4 * rate))
            b = self._nodes[node] = NodeBuckets(output=output)
        return b

    def apply(self, node: str, events: Sequence[Event]) -> Charged:
        """Charge ``events`` to ``node``'s quotas: what to store (over-quota output summarised)
        and how far over the quotas the batch went."""
        b = self.buckets(node)
        out = Charged([])
        for e in events:
            size = event_bytes(e)
            counted = b.events.take(1.0)
            if not counted:
                out.over_events += 1
            if (counted and (size == 0 or b.output.take(size))) or size <= len(QUOTA_MARKER):
                out.events.append(e)
            else:
                out.events.append(summarised(e))
                out.summarised += 1
                out.over_bytes += size
        return out

    def renewal(self, node: str) -> bool:
        """One certificate renewal for ``node``, if within its rate."""
        return self.buckets(node).renewals.take()

    def connect(self, node: str) -> float:
        """0 when ``node`` may open a stream now, else the seconds to wait."""
        bucket = self.buckets(node).connects
        return 0.0 if bucket.take() else retry_after(bucket)

    @staticmethod
    def pause(charged: Charged) -> float:
        """How long to stop reading from a node after a batch that went over its quotas: what is
        over is still read, but at most ``NODE_EXCESS_READ_BYTES_PER_SECOND`` and
        ``NODE_EVENTS_PER_SECOND`` (HTTP/2 flow control holds the node back meanwhile)."""
        seconds = (
            charged.over_bytes / NODE_EXCESS_READ_BYTES_PER_SECOND
            + charged.over_events / NODE_EVENTS_PER_SECOND
        )
        return min(QUOTA_PAUSE_SECONDS, seconds)

    def forget(self, node: str) -> None:
        self._nodes.pop(node, None)
