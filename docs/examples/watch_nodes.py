#!/usr/bin/env python3
"""Watch an environment's nodes and react: print every change, count the failed nodes, and stop
(exit 1) once more than --max-failed have failed. The SDK only.

    python docs/examples/watch_nodes.py [--env NAME] [--config admin.conf] [--context NAME]
        [--max-failed N]

The admin.conf comes from --config, else $TETHER_CONFIG, else ~/.config/tether/admin.conf, as for
tetherctl. The watch lists the nodes first, then sends one event per state change; it resumes by
itself after a broken stream (no change missed), and when the controller no longer keeps its
revision it lists again, after a ``RELIST`` marker: the map below is rebuilt from that list.
Ctrl-C ends it (exit 130).
"""

from __future__ import annotations

import argparse
import sys

from tether.controller.client import Client, ConfigError
from tether.controller.client.errors import ApiError
from tether.controller.client.watch import RELIST
from tether.v1 import admin_pb2

EXIT_FAILED = 1


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="", help="one environment (default: every one the admin may see)")
    p.add_argument("--config", help="admin.conf (default: $TETHER_CONFIG or ~/.config/tether/admin.conf)")
    p.add_argument("--context", help="which controller of a config with contexts")
    p.add_argument("--max-failed", type=int, default=-1, help="exit 1 once more nodes than this failed")
    return p.parse_args()


def watch(client: Client, environment: str, max_failed: int) -> int:
    states: dict[str, str] = {}  # node -> its state, as the watch tells it
    for event in client.watch_nodes(environment):
        node = event.node
        if event.reason == RELIST:
            states.clear()  # a fresh list follows
            print("-- listing again", file=sys.stderr)
        elif event.type == admin_pb2.NODE_EVENT_TYPE_SYNCED:
            print(f"{len(states)} node(s), watching (revision {event.revision})")
        elif event.type == admin_pb2.NODE_EVENT_TYPE_DELETED:
            states.pop(node.name, None)
            print(f"{node.name}: deleted")
        else:
            states[node.name] = node.state
            if event.reason:  # a change (the initial list has none)
                print(f"{node.name} ({node.environment}): {event.reason}")
        failed = sorted(name for name, state in states.items() if state == "failed")
        if event.reason == "failed" or (event.type == admin_pb2.NODE_EVENT_TYPE_SYNCED and failed):
            print(f"failed: {len(failed)} ({', '.join(failed)})")
        if 0 <= max_failed < len(failed):
            print(f"more than {max_failed} node(s) failed: stopping", file=sys.stderr)
            return EXIT_FAILED
    return 0


def main() -> int:
    args = parse()
    try:
        client = Client.from_admin_conf(args.config, args.context)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_FAILED
    with client:
        try:
            return watch(client, args.env, args.max_failed)
        except ApiError as exc:
            print(f"{exc.code.name}: {exc.message}", file=sys.stderr)
            return EXIT_FAILED
        except KeyboardInterrupt:
            return 130


if __name__ == "__main__":
    sys.exit(main())
