"""Issue 10 item 15 (agent side): a corrupt state database is one line naming the file, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tether.nodeagent.errors import StateError
from tether.nodeagent.model import Event, EventKind
from tether.nodeagent.outbox import Outbox
from tether.nodeagent.session import state_summary
from tether.nodeagent.statedb import StateDB

AGENT = Path(sys.executable).parent / "tether-agent"


def agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(AGENT), *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("command", ["run", "status"])
def test_random_bytes_for_a_database_give_one_line_and_a_non_zero_exit(tmp_path: Path, command: str) -> None:
    db = tmp_path / "state.db"
    db.write_bytes(os.urandom(20_000))
    extra = ["--controller", "127.0.0.1:1"] if command == "run" else []
    out = agent(command, "--state-dir", str(tmp_path), *extra)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"tether-agent: state database {db} is corrupt (file is not a database): move it aside to "
        "start over; the node must then be revoked and enrolled again"
    ]


def test_a_damaged_page_is_found_at_open_and_names_the_file_too(tmp_path: Path) -> None:
    db = StateDB(tmp_path / "state.db")
    Outbox(db).append([Event(kind=EventKind.OUTPUT, step="s", lines=("x" * 3000,)) for _ in range(200)])
    db.close()
    raw = bytearray((tmp_path / "state.db").read_bytes())
    raw[8192:-4096] = os.urandom(len(raw) - 8192 - 4096)  # keep the header and the schema page
    (tmp_path / "state.db").write_bytes(bytes(raw))
    corrupt = r"^state database .*state\.db is corrupt \(.*\): move it aside"
    with pytest.raises(StateError, match=corrupt):
        state_summary(tmp_path)
    with pytest.raises(StateError, match=corrupt):  # what `tether-agent run` opens
        StateDB(tmp_path / "state.db")


def test_an_unreadable_database_says_which_file(tmp_path: Path) -> None:
    (tmp_path / "state.db").mkdir()  # a directory where the file should be
    with pytest.raises(StateError, match=r"^cannot use state database .*state\.db: "):
        StateDB(tmp_path / "state.db")
