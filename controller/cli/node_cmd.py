"""tetherctl node delete | reset | list -w: let a node go (forget it, or deprovision it first); watch.

    tetherctl node delete NAME [--force]     the record and history go (--force: a connected node)
    tetherctl node reset NAME [--wait]       leave the cluster, remove the agent, then forget it
    tetherctl node list -w [--env E] [-o json]   the list, then a line per state change (WatchNodes)
    tetherctl node release NAME              let a quarantined node go on once (spec.hardware)

``node reset --wait`` exits 0 once the node is gone, 1 when a reset step failed (the node stays:
``node reset`` again retries what failed, ``node delete --force`` gives up on it), 2 on timeout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import grpc

from tether.controller import tokens, wire
from tether.controller.cli.client import CliError, Session, explain
from tether.controller.cli.output import ago, colour, rfc3339, shape, table, when
from tether.controller.client.errors import ApiError
from tether.controller.client.watch import RELIST, watch_nodes
from tether.controller.limits import RESET_TIMEOUT_SECONDS
from tether.nodeagent.model import now_ms

POLL_SECONDS = 1.0
EXIT_FAILED, EXIT_TIMEOUT = 1, 2


def add_verbs(node: Any) -> None:
    """The verbs on ``tetherctl node`` (its subparsers)."""
    d = node.add_parser("delete", help="forget a node: its record, steps and events")
    d.add_argument("name")
    d.add_argument(
        "--force", action="store_true", help="also a connected node: it is revoked first (its agent stops)"
    )
    d.set_defaults(func=delete)
    r = node.add_parser(
        "reset",
        help="deprovision a node: leave the cluster, remove the agent, its config and state; then forget it",
    )
    r.add_argument("name")
    r.add_argument("--wait", action="store_true", help="until the node is gone (or a reset step failed)")
    wait = f"{RESET_TIMEOUT_SECONDS // 60}m"  # the controller gives up on the reset then, too
    r.add_argument(
        "--wait-timeout", default=wait, help=f"with --wait: give up after this long (default {wait})"
    )
    r.set_defaults(func=reset)
    rl = node.add_parser(
        "release",
        help="let a quarantined node go on once, although its hardware does not match spec.hardware",
    )
    rl.add_argument("name")
    rl.set_defaults(func=release)


def release(args: argparse.Namespace) -> int:
    Session(args).call("ReleaseNode", wire.admin.ReleaseNodeRequest(name=args.name))
    print(f"node/{args.name} released: it goes on once (its events record who released it)")
    return 0


def delete(args: argparse.Namespace) -> int:
    Session(args).call("DeleteNode", wire.admin.DeleteNodeRequest(name=args.name, force=args.force))
    print(f"node/{args.name} deleted")
    return 0


def reset(args: argparse.Namespace) -> int:
    try:
        limit = tokens.parse_duration(args.wait_timeout)
    except ValueError as exc:
        raise CliError(f"--wait-timeout: {exc}", exit_code=EXIT_TIMEOUT) from None
    session = Session(args)
    session.call("ResetNode", wire.admin.ResetNodeRequest(name=args.name))
    if not args.wait:
        print(f"node/{args.name} reset started (tetherctl node describe {args.name} shows its steps)")
        return 0
    return wait_gone(session, args.name, limit)


def wait_gone(session: Session, name: str, limit_s: float) -> int:
    """Until the controller has forgotten ``name`` (0), a reset step failed (1) or time ran out (2)."""
    deadline = time.monotonic() + limit_s
    shown = ""
    while True:
        node = _get(session, name)
        if node is None:
            print(f"node/{name} reset: the node left and is forgotten")
            return 0
        failed = next((s for s in node.steps if s.state == "failed"), None)
        if failed is not None:
            print(
                f"tetherctl: node {name}: reset step {failed.name} failed: "
                f"{failed.message or f'exit code {failed.exit_code}'} (tetherctl events --node {name}); "
                f"node reset {name} runs it again, node delete {name} --force gives up",
                file=sys.stderr,
            )
            return EXIT_FAILED
        running = next((s.name for s in node.steps if s.state not in ("succeeded", "skipped")), "")
        status = f"{node.state}, at step {running}" if running else node.state
        if status != shown:
            print(f"node/{name}: {status}", file=sys.stderr)
            shown = status
        if time.monotonic() >= deadline:
            print(f"tetherctl: node {name} is still there after {limit_s:g}s ({status})", file=sys.stderr)
            return EXIT_TIMEOUT
        time.sleep(POLL_SECONDS)


def _get(session: Session, name: str) -> Any:
    try:
        return session.stub.GetNode(wire.admin.GetNodeRequest(name=name), timeout=session.timeout)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise


# -- node list --watch ------------------------------------------------------------------------


def node_watch(args: argparse.Namespace) -> int:
    """``node list -w``: the list, then one line per state change (``-o json``: one object a line).
    It resumes by itself after a broken stream; Ctrl-C ends it (130)."""
    if args.output == "yaml":
        raise CliError("--watch prints a table and then lines, or -o json: one object per line")
    session = Session(args)
    events = watch_nodes(session.stub, args.environment)
    listed: list[Any] = []
    try:
        for event in events:
            if args.output == "json":
                print(json.dumps(_event_json(event)), flush=True)
            elif event.type == wire.admin.NODE_EVENT_TYPE_ADDED and not event.reason:
                listed.append(event.node)  # the list: one table once it is complete
            elif event.type == wire.admin.NODE_EVENT_TYPE_SYNCED:
                _list_table(listed)
                listed = []
            elif event.reason == RELIST:
                print("-- the watch's history moved on: listing again", flush=True)
            else:
                n = event.node
                print(f"{when(now_ms())}  {n.name}  {n.environment}  {event.reason}", flush=True)
    except ApiError as exc:
        raise explain(exc, session.conf.controller) from None
    except KeyboardInterrupt:
        return 130
    finally:
        events.close()
    return 0


def _event_json(event: Any) -> dict[str, Any]:
    kind = wire.admin.NodeEventType.Name(event.type).removeprefix("NODE_EVENT_TYPE_").lower()
    return {
        "time": rfc3339(now_ms()),
        "type": "relist" if event.reason == RELIST else kind,
        "revision": event.revision,
        "reason": event.reason,
        "node": shape(event.node) if event.HasField("node") else None,
    }


def _list_table(nodes: list[Any]) -> None:
    rows = [
        [n.name, n.environment, n.role, colour(n.state), "now" if n.connected else ago(n.last_seen_ms)]
        for n in nodes
    ]
    table(rows, ["NAME", "ENVIRONMENT", "ROLE", "STATE", "SEEN"])
    sys.stdout.flush()


__all__ = ["add_verbs", "node_watch"]
