"""The README's "Quickstart by hand", run as written, so it can never drift from what works.

The one ``bash`` block of that section (marked by the ``<!-- quickstart:`` comment above it) runs
with ``bash -e`` in a fresh directory laid out like a clone (its Makefile, pyproject.toml, docs/
and the test's own .venv), with the README's relative paths. One substitution: the controller
listens on port 0 instead of 7443 (nothing else in the block may name the port: the agent gets
the address from the join command). Every process the block leaves running is stopped by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEADING = "## Quickstart by hand"
MARKER = "<!-- quickstart:"
LISTEN = "--listen 127.0.0.1:7443"
FENCE = re.compile(r"^```bash\n(.*?)^```$", re.S | re.M)


class QuickstartNotFound(AssertionError):
    """README.md no longer holds the quickstart the way this test reads it."""


def quickstart_block(readme: str) -> str:
    """The section's one bash block, which must follow the marker comment directly."""
    if readme.count(f"\n{HEADING}\n") != 1:
        raise QuickstartNotFound(f"README.md must have exactly one {HEADING!r} heading")
    section = readme.split(f"\n{HEADING}\n", 1)[1]
    section = re.split(r"^## ", section, maxsplit=1, flags=re.M)[0]
    blocks = FENCE.findall(section)
    if len(blocks) != 1:
        raise QuickstartNotFound(f"{HEADING!r} must hold exactly one ```bash block, not {len(blocks)}")
    marker_at, fence_at = section.find(MARKER), section.find("```bash")
    if marker_at < 0 or section[marker_at:fence_at].count("\n") != 1:
        raise QuickstartNotFound(f"the line right above the bash block must be the {MARKER!r} comment")
    return str(blocks[0])


def test_the_block_is_found_strictly() -> None:
    body = f"x\n{HEADING}\n\n{MARKER} it -->\n```bash\necho hi\n```\n\n## Next\n```bash\nno\n```\n"
    assert quickstart_block(body) == "echo hi\n"
    for broken in (
        body.replace(HEADING, "## Quickstart"),  # heading renamed
        body.replace(f"{MARKER} it -->\n", ""),  # marker gone
        body.replace("```\n\n## Next", "```\n```bash\nmore\n```\n\n## Next"),  # two blocks
        body.replace("```bash\necho", "```sh\necho"),  # not bash
    ):
        with pytest.raises(QuickstartNotFound):
            quickstart_block(broken)


def _fresh_clone(work: Path) -> None:
    """What the quickstart needs of a clone, with the venv this test runs in already made."""
    installed = Path(sys.prefix) / ".installed"
    if not installed.exists():
        pytest.fail(f"{installed} is missing: make the venv with `make venv` (the quickstart's first step)")
    work.mkdir()
    shutil.copy(ROOT / "Makefile", work / "Makefile")
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    before = installed.stat().st_mtime - 60  # checked out before the venv was made: `make venv` is a no-op
    os.utime(work / "pyproject.toml", (before, before))
    (work / ".venv").symlink_to(sys.prefix)
    (work / "docs").symlink_to(ROOT / "docs")


def _group_pids(pgid: int) -> list[int]:
    """Live processes of a process group (read from /proc)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def _stop_group(pgid: int) -> None:
    """SIGTERM each process the block started, by PID; SIGKILL what is left after 10 s."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        for pid in _group_pids(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while _group_pids(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _group_pids(pgid):
            return


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []


@pytest.fixture
def quickstart_dir(tmp_path: Path) -> Path:
    work = tmp_path / "clone"
    _fresh_clone(work)
    return work


def test_the_quickstart_runs_as_written(quickstart_dir: Path, request: pytest.FixtureRequest) -> None:
    block = quickstart_block((ROOT / "README.md").read_text())
    assert block.count(LISTEN) == 1, f"the block must start its controller with {LISTEN!r}, once"
    commands = re.sub(r"(^|\s)#.*$", "", block.replace(LISTEN, ""), flags=re.M)
    assert "7443" not in commands, "only the controller's --listen may name the port (comments may)"
    (quickstart_dir / "quickstart.sh").write_text(block.replace(LISTEN, "--listen 127.0.0.1:0"))

    rc, transcript, pgid = _run_block(quickstart_dir, request)
    logs = "".join(
        f"\n--- {name}\n{(quickstart_dir / name).read_text()[-4000:]}"
        for name in ("ctl.log", "agent.log")
        if (quickstart_dir / name).exists()
    )
    assert rc == 0, f"the quickstart failed (exit {rc}):\n{transcript}{logs}"

    assert "node-1" in transcript and "provisioned" in transcript
    nodes = json.loads(_ctl(quickstart_dir, "node", "list", "-o", "json"))
    assert [(n["name"], n["state"]) for n in nodes] == [("node-1", "provisioned")]
    agents = [_cmdline(pid) for pid in _group_pids(pgid) if "tether-agent" in " ".join(_cmdline(pid))]
    assert len(agents) == 1, agents
    assert agents[0][-3:] == ["run", "--state-dir", "./agent"], agents  # no --controller: remembered
    assert (quickstart_dir / "agent" / "node.json").stat().st_mode & 0o077 == 0
    _check_made_files_are_ignored(quickstart_dir)


def _run_block(work: Path, request: pytest.FixtureRequest) -> tuple[int, str, int]:
    """Run quickstart.sh with ``bash -e`` as a user's shell would (no venv on PATH, no TETHER_*
    settings); (exit status, what it printed, its process group), the group stopped at teardown."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_") and k != "VIRTUAL_ENV"}
    venv_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    with (work.parent / "quickstart.out").open("w+") as out:
        proc = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "quickstart.sh"],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: every process it starts is found by it
        )
        request.addfinalizer(lambda: _stop_group(proc.pid))
        try:
            rc = proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            rc = -1
        out.seek(0)
        return rc, out.read(), proc.pid


CLONE_FILES = {"Makefile", "pyproject.toml", "docs", ".venv", "quickstart.sh", ".gitignore"}


def _check_made_files_are_ignored(work: Path) -> None:
    """Everything the quickstart made (keys, state, logs) is kept out of commits by .gitignore."""
    shutil.copy(ROOT / ".gitignore", work / ".gitignore")
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    untracked = {line[3:].split("/", 1)[0] for line in status.splitlines() if line.startswith("?? ")}
    assert untracked <= CLONE_FILES, f"made by the quickstart and not git-ignored: {untracked - CLONE_FILES}"
    assert {"ctl", "agent", "ctl.log", "agent.log"} <= {p.name for p in work.iterdir()}


def _ctl(work: Path, *args: str) -> str:
    done = subprocess.run(
        [str(Path(sys.prefix) / "bin" / "tetherctl"), "--config", str(work / "ctl" / "admin.conf"), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
