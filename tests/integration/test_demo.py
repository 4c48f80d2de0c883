"""`make demo` (scripts/demo.py): it provisions its node, and Ctrl-C ends it cleanly.

Either way its processes are stopped and its last line names, as an absolute path, the directory
its files are in. Each run is in its own process group, as a terminal's foreground job is
(Ctrl-C is SIGINT to that group), and writes under tmp_path only: `make demo` runs in a copy of
the clone's few files it needs (so its .tether-demo lands there), scripts/demo.py with
``--dir`` given relative to tmp_path.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _group_alive(pgid: int) -> list[int]:
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


def _start(argv: list[str], cwd: Path, request: pytest.FixtureRequest) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )

    def stop() -> None:  # whatever the demo left behind, by PID
        for pid in _group_alive(proc.pid):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()

    request.addfinalizer(stop)
    return proc


def _last_line(output: str) -> str:
    return [line for line in output.splitlines() if line.strip()][-1]


def _make_demo_clone(work: Path) -> None:
    """The files `make demo` reads, its venv already made (so `venv` is up to date)."""
    installed = Path(sys.prefix) / ".installed"
    if not installed.exists():
        pytest.fail(f"{installed} is missing: make the venv with `make venv`")
    (work / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "Makefile", work / "Makefile")
    shutil.copy(ROOT / "scripts" / "demo.py", work / "scripts" / "demo.py")  # its root: work
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    before = installed.stat().st_mtime - 60
    os.utime(work / "pyproject.toml", (before, before))
    (work / ".venv").symlink_to(sys.prefix)
    (work / "docs").symlink_to(ROOT / "docs")


def test_ctrl_c_on_make_demo_says_interrupted_and_where_the_files_are(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    _make_demo_clone(tmp_path / "clone")
    proc = _start(["make", "demo"], tmp_path / "clone", request)
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen.append(line)
        if "listening on" in line or not line:
            break
    assert "listening on" in seen[-1], "".join(seen)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
    rest, _ = proc.communicate(timeout=60)
    output = "".join(seen) + rest
    assert proc.returncode != 0, output  # make itself was interrupted
    assert "demo: interrupted" in output
    assert "Traceback" not in output
    last = _last_line(output)
    files = tmp_path / "clone" / ".tether-demo"
    assert last.startswith(f"demo files: {files} "), output  # not a line of make's after it
    assert output.index("demo: interrupted") < output.index(last)
    assert (files / "controller" / "admin.conf").exists()
    time.sleep(0.5)
    assert _group_alive(proc.pid) == [], "the demo left processes running"


def test_the_demo_provisions_its_node(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    demo = [sys.executable, str(ROOT / "scripts" / "demo.py"), "--dir", "demo-files"]
    proc = _start(demo, tmp_path, request)
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, output
    assert "demo complete: the node is provisioned" in output
    assert "TETHER_JOIN_TOKEN=<join token>" in output  # the token itself is never shown
    items = tmp_path / "demo-files" / "agent" / "workspace" / "demo-items"
    assert f"provisioned 5 items in {items}" in output  # the report step names the real place
    assert _last_line(output).startswith(f"demo files: {tmp_path / 'demo-files'} ")
    assert _group_alive(proc.pid) == []
