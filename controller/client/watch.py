"""Watch nodes, resumably: ``watch_nodes`` yields every ``NodeEvent`` and outlives a broken stream.

From revision 0 the controller sends the current list (one ``ADDED`` per node, ``reason`` ""),
then ``SYNCED``, then one event per state change. When the stream breaks (``UNAVAILABLE``, a
reset connection, a controller restart, a watcher cut off for reading too slowly) it connects again
from the last revision it saw, waiting a little longer each time (``BACKOFF_FIRST_SECONDS``
doubling up to ``BACKOFF_MAX_SECONDS``, at most ``RECONNECT_ATTEMPTS`` times in a row without an
event), so no change is missed and none is repeated.

When the controller no longer keeps that revision (``OUT_OF_RANGE``: it restarted, or the watch
was away for more changes than it keeps), it lists again from revision 0 and says so: it yields
one marker event, ``type`` ``NODE_EVENT_TYPE_UNSPECIFIED`` with ``reason`` ``RELIST`` ("relist"),
before the new list (``ADDED``... then ``SYNCED``). Whoever keeps a map of nodes clears it there.
A stream that breaks during a list is listed again the same way. With ``resume=False`` nothing is
retried: the first error is raised. Errors are raised as ``tether.controller.client.errors``
exceptions (``from_rpc_error``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator
from typing import Any

import grpc

from tether.controller.client.errors import from_rpc_error
from tether.v1 import admin_pb2

log = logging.getLogger("tether.client.watch")

RELIST = "relist"  # the reason of the marker event yielded before a list taken again
RECONNECT_ATTEMPTS = 8  # reconnections in a row that bring no event; then the error is raised
BACKOFF_FIRST_SECONDS = 0.2
BACKOFF_MAX_SECONDS = 5.0
RESUMABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,  # the controller is away, or restarting
        grpc.StatusCode.RESOURCE_EXHAUSTED,  # this watch fell behind and was cut off
        grpc.StatusCode.CANCELLED,  # the server ended the call (shutting down)
        grpc.StatusCode.INTERNAL,  # a broken stream (RST_STREAM)
        grpc.StatusCode.UNKNOWN,
    }
)


def _moves(event: admin_pb2.NodeEvent) -> bool:
    """Whether resuming from ``event``'s revision is right: a change, or the end of a list."""
    return event.type == admin_pb2.NODE_EVENT_TYPE_SYNCED or bool(event.reason)


def _relist_marker() -> admin_pb2.NodeEvent:
    return admin_pb2.NodeEvent(type=admin_pb2.NODE_EVENT_TYPE_UNSPECIFIED, reason=RELIST)


def watch_nodes(
    stub: Any, environment: str = "", revision: int = 0, *, resume: bool = True
) -> Generator[admin_pb2.NodeEvent, None, None]:
    """The node events of ``environment`` ("" = every one the caller may see) from ``revision``
    (0: the list first); with ``resume``, across broken streams (see the module docstring).
    ``stub``: an ``AdminServiceStub``. Closing the iterator ends the call."""
    position, failures = revision, 0
    while True:
        call = stub.WatchNodes(admin_pb2.WatchNodesRequest(environment=environment, revision=position))
        error: grpc.RpcError | None = None
        listing = False  # events of a list (revision 0) were yielded, and its SYNCED was not
        try:
            for event in call:
                failures = 0
                if _moves(event):
                    position, listing = event.revision, False
                else:
                    listing = True
                yield event
        except grpc.RpcError as exc:
            error = exc
        finally:
            call.cancel()
        code = error.code() if error is not None else grpc.StatusCode.UNAVAILABLE  # ended: broken
        if not resume:
            if error is not None:
                raise from_rpc_error(error) from None
            return
        expired = code == grpc.StatusCode.OUT_OF_RANGE
        if not expired:
            if code not in RESUMABLE or failures >= RECONNECT_ATTEMPTS:
                raise from_rpc_error(error if error is not None else _Ended()) from None
            time.sleep(min(BACKOFF_MAX_SECONDS, BACKOFF_FIRST_SECONDS * 2**failures))
            failures += 1
        if expired or listing:
            log.warning("node watch: listing again (%s)", error.details() if error else "a list broke off")
            position = 0
            yield _relist_marker()


class _Ended(grpc.RpcError):
    """A watch that the controller kept ending without an error."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the node watch kept ending; giving up"


__all__ = ["RELIST", "watch_nodes"]
