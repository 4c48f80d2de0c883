"""tether benchmarks: one JSON object per line on stdout, progress on stderr.

    python bench/run.py [--quick] [--keep] [--only fleet|agent|flood|store|replicas] [--flood-agents N]

Every figure comes with a bare baseline measured in the same invocation: a minimal grpc.aio
server (bench/bare.py) with the controller's TLS set-up, options and message sizes. The
server under test is pinned to one core, the clients to the other(s). See docs/performance.md.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "proto"))  # the tether package

from bench import replicas
from bench.common import CLIENT_CPUS, SERVER_CPUS, Proc, emit, log
from bench.scenarios import FULL, QUICK, check_open_files, run_agent_only, run_bare, run_controller, run_flood


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller fleet, shorter windows (< 3 minutes)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, store) for inspection")
    p.add_argument(
        "--only",
        choices=["fleet", "agent", "flood", "store", "replicas"],
        help="run one scenario alone: fleet = the bare and controller fleets (enrollment, capacity,"
        " heartbeats, events, storm, node list), without the agent's figures and the flood;"
        " agent = the agent's figures, overhead per step and idle footprint"
        " (no fleet, no baseline server; valgrind counts instructions where installed);"
        " flood = heartbeat round trips while one agent floods output; store = SQLite vs PostgreSQL;"
        " replicas = two controller replicas on PostgreSQL (scale-out, kill -9 failover)",
    )
    p.add_argument("--flood-agents", type=int, help="heartbeating agents in --only flood (default 2000)")
    args = p.parse_args()
    sizes = QUICK if args.quick else FULL
    if args.flood_agents:
        sizes = dataclasses.replace(sizes, flood_agents=args.flood_agents)
    work = Path(tempfile.mkdtemp(prefix="tether-bench-"))

    def cleanup() -> None:
        Proc.cleanup()
        if args.keep:
            log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    atexit.register(cleanup)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.monotonic()
    log(
        f"{'quick' if args.quick else 'full'} run: {sizes}; server on CPU {sorted(SERVER_CPUS)}, "
        f"clients on CPU {sorted(CLIENT_CPUS)}; work dir {work}"
    )
    if args.only == "agent":
        run_agent_only(work, sizes, emit)
    elif args.only == "flood":
        run_flood(work, sizes, emit)
    elif args.only == "store":
        replicas.run_store(work, sizes, args.quick, emit)
    elif args.only == "replicas":
        replicas.run_replicas(work, sizes, args.quick, emit)
    else:
        limit = check_open_files(sizes)
        log(f"open-files limit {limit} (servers and clients): {sizes.agents} agents at once")
        bare = run_bare(work, sizes)
        run_controller(work, sizes, bare, args.quick, emit, with_agent=args.only != "fleet")
        if args.only != "fleet":
            run_flood(work, sizes, emit)
    log(f"done in {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
