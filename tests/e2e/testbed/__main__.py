"""CLI: ``python -m tests.e2e.testbed up --nodes N --state DIR``, ``down --state DIR``, ``show --state DIR``.

``up`` prints one JSON object on stdout (progress goes to stderr) and exits, leaving the testbed running.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tests.e2e.testbed.testbed import Testbed, down_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.testbed", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build (if needed) and boot a testbed, print its JSON description")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--state", type=Path, required=True, help="state directory (created; one testbed each)")
    up.add_argument(
        "--lb", action="store_true", help="also start a TCP load balancer for :6443 on the bridge"
    )
    up.add_argument("--volatile", action="store_true", help="nodes forget everything on reboot")
    down = sub.add_parser("down", help="remove everything the testbed in --state made")
    down.add_argument("--state", type=Path, required=True)
    show = sub.add_parser("show", help="print the JSON description of a running testbed")
    show.add_argument("--state", type=Path, required=True)
    args = parser.parse_args(argv)

    if args.command == "up":
        bed = Testbed.up(args.state, args.nodes, lb=args.lb, volatile=args.volatile)
        print(json.dumps(bed.describe(), indent=2))
        return 0
    if args.command == "show":
        print(json.dumps(Testbed.load(args.state).describe(), indent=2))
        return 0
    problems = down_dir(args.state)
    for problem in problems:
        print(f"left behind: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
