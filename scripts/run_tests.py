#!/usr/bin/env python3
"""Every test tier in two groups: `make test` (--serial, what CI runs) and `make test-parallel`.

The e2e tier spends its time waiting on systemd-nspawn nodes, the unit and integration tiers on
loopback controllers and agents; one after the other they take about 38 minutes here, side by
side 25 (the Makefile says why CI still runs them one after the other). Each group's lines are
prefixed with its name; the run fails when either fails (pytest's exit code 5, "no tests
collected", included) and ends with a line per group. Extra arguments go to both pytest runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTEST = [sys.executable, "-m", "pytest", "-q"]
GROUPS = {
    "unit+integration": ["tests/unit", "tests/integration", "--durations=15"],
    # no cache plugin: two sessions would both write .pytest_cache at their end
    "e2e": ["tests/e2e", "--durations=15", "-p", "no:cacheprovider"],
}


@dataclass
class Group:
    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    seconds: float = 0.0
    rc: int = -1
    reader: threading.Thread | None = field(default=None, repr=False)

    def start(self, lock: threading.Lock) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.reader = threading.Thread(target=self._copy, args=(lock,), daemon=True)
        self.reader.start()

    def _copy(self, lock: threading.Lock) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        prefix = f"[{self.name}] ".encode()
        for line in self.proc.stdout:
            with lock:
                sys.stdout.buffer.write(prefix + line)
                sys.stdout.buffer.flush()
        self.proc.stdout.close()
        self.proc.wait()
        self.seconds = time.monotonic() - self.started  # its own time, not the other group's

    def wait(self) -> int:
        assert self.proc is not None
        assert self.reader is not None
        self.rc = self.proc.wait()
        self.reader.join()
        return self.rc

    def stop(self) -> None:
        """End the pytest we started (its session: it started the fixtures' processes in it)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # pytest's finalizers tear testbeds down


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serial", action="store_true", help="run the groups one after the other")
    args, extra = ap.parse_known_args(argv)
    groups = [Group(name, [*PYTEST, *paths, *extra]) for name, paths in GROUPS.items()]
    lock = threading.Lock()
    try:
        if args.serial:
            for g in groups:
                g.start(lock)
                g.wait()
        else:
            for g in groups:
                g.start(lock)
            for g in groups:
                g.wait()
    except KeyboardInterrupt:
        for g in groups:
            g.stop()
        for g in groups:
            if g.proc is not None:
                g.wait()
        print("interrupted", file=sys.stderr)
        return 130
    for g in groups:
        verdict = "passed" if g.rc == 0 else f"FAILED (pytest exit code {g.rc})"
        print(f"{g.name}: {verdict} in {g.seconds / 60:.1f} min")
    return 0 if all(g.rc == 0 for g in groups) else 1


if __name__ == "__main__":
    sys.exit(main())
