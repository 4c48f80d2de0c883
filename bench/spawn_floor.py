"""The floor under any asyncio agent: spawn each script with asyncio, read its output, wait.

    python bench/spawn_floor.py RUNS SCRIPT...

Prints the median seconds of RUNS passes over the scripts. No journal, no events, no
gRPC: what Python's asyncio subprocess machinery alone costs over ``bash`` running the
same scripts (a 50-step plan of trivial steps spends a few per cent there).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time


async def one_pass(scripts: list[str]) -> float:
    t0 = time.perf_counter()
    for script in scripts:
        proc = await asyncio.create_subprocess_exec(
            "bash",
            script,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        assert proc.stdout is not None
        await proc.stdout.read()
        await proc.wait()
    return time.perf_counter() - t0


def main() -> None:
    runs, scripts = int(sys.argv[1]), sys.argv[2:]
    if sys.version_info < (3, 12):  # what the agent does (tether.nodeagent.main)
        asyncio.get_event_loop_policy().set_child_watcher(asyncio.PidfdChildWatcher())
    print(statistics.median(asyncio.run(one_pass(scripts)) for _ in range(runs)))


if __name__ == "__main__":
    main()
