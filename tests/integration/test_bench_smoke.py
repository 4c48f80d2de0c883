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
    assert names == ["agent.overhead_ms_per_step", "agent.overhead_pct", "agent.rss_mib"]
    for f in figures:
        assert set(f) == KEYS and isinstance(f["met"], bool) and f["value"] is not None, f
    table = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "table.py")],
        input=proc.stdout,
        capture_output=True,
        text=True,
        check=True,
    )
    assert table.stdout.count("\n| agent.") == 3
