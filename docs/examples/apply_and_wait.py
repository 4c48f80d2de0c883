#!/usr/bin/env python3
"""Apply an environment, then wait until every node of it is provisioned: the SDK only.

    python docs/examples/apply_and_wait.py ENV.yaml [--config admin.conf] [--context NAME]
        [--timeout SECONDS] [--nodes N] [--expect-generation G]

The admin.conf comes from --config, else $TETHER_CONFIG, else ~/.config/tether/admin.conf, as
for tetherctl. Progress goes to stderr. Exit codes as ``tetherctl wait``: 0 every node is
provisioned on the applied generation; 1 one failed (or the rollout halted), or the apply was
refused; 2 timed out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tether.controller.client import Client, ConfigError
from tether.controller.client.errors import AbortedError, ApiError, InvalidArgumentError
from tether.controller.client.waiting import Progress

EXIT_FAILED, EXIT_TIMEOUT = 1, 2


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", type=Path, help="the environment document (YAML)")
    p.add_argument("--config", help="admin.conf (default: $TETHER_CONFIG or ~/.config/tether/admin.conf)")
    p.add_argument("--context", help="which controller of a config with contexts")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (default 600)")
    p.add_argument("--nodes", type=int, default=1, help="wait for at least this many nodes (default 1)")
    p.add_argument("--expect-generation", type=int, default=0, help="apply only at this generation")
    return p.parse_args()


def show(progress: Progress) -> None:
    if progress.waiting:
        print(f"waiting: {progress.waiting}", file=sys.stderr, flush=True)


def apply(client: Client, document: str, expected: int) -> str | None:
    """The environment's name once applied, or None (the reasons printed)."""
    try:
        reply = client.apply_environment(document, expected_generation=expected)
    except InvalidArgumentError as exc:
        for problem in [str(v) for v in exc.field_violations] or [exc.message]:
            print(f"invalid: {problem}", file=sys.stderr)
        return None
    except AbortedError as exc:
        print(f"not applied: {exc.message}", file=sys.stderr)
        return None
    env = reply.environment
    what = "applied" if reply.changed else "unchanged"
    print(f"environment/{env.name} {what} (generation {env.generation})")
    return env.name


def main() -> int:
    args = parse()
    document = args.file.read_text()
    try:
        client = Client.from_admin_conf(args.config, args.context)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_FAILED
    with client:
        try:
            name = apply(client, document, args.expect_generation)
            if name is None:
                return EXIT_FAILED
            result = client.wait_for_nodes(name, timeout=args.timeout, min_nodes=args.nodes, on_progress=show)
        except ApiError as exc:
            print(f"{exc.code.name}: {exc.message}", file=sys.stderr)
            return EXIT_FAILED
    if result.done:
        print(f"environment {name}: {result.nodes} node(s) provisioned")
        return 0
    if result.failure:
        print(result.failure, file=sys.stderr)
        return EXIT_FAILED
    print(f"timed out after {args.timeout:g}s: {result.waiting}", file=sys.stderr)
    return EXIT_TIMEOUT


if __name__ == "__main__":
    sys.exit(main())
