"""The benchmark entry point still runs and speaks its output contract (no figures are judged here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"name", "value", "unit", "baseline", "ratio", "target", "met", "detail"}


@pytest.mark.timeout(420)
def test_bench_only_agent_prints_json_figures() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--only", "agent"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = [json.loads(line) for line in proc.stdout.splitlines()]
    names = [f["name"] for f in figures]
    assert names == [
        "agent.overhead_ms_per_step",
        "agent.overhead_pct",
        "agent.instructions_per_step",
        "agent.cpu_ms_per_step",
        "agent.wall_overhead_ms_per_step",
        "agent.rss_mib",
        "agent.idle_cpu_pct",
        "agent.idle_cpu_pct_heartbeat_1s",
    ]
    for f in figures:
        assert set(f) == KEYS and isinstance(f["met"], bool), f
        # Without valgrind there is no instruction count (and the figure says why).
        valgrind_missing = f["name"] == "agent.instructions_per_step" and "valgrind" in f["detail"].get(
            "error", ""
        )
        assert f["value"] is not None or valgrind_missing, f
    overhead = figures[0]
    assert overhead["value"] >= 0, overhead  # a per-step cost is never negative
    table = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "table.py")],
        input=proc.stdout,
        capture_output=True,
        text=True,
        check=True,
    )
    assert table.stdout.count("\n| agent.") == len(names)
