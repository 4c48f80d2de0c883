"""Issue 10, item 18: start-up errors are one line, a non-zero exit, and nothing created on disk."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import BIN

pytestmark = pytest.mark.integration


def _serve(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "tether-controller"), "serve", "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize(
    ("listen", "says"),
    [
        ("localhost", "expected HOST:PORT"),
        ("127.0.0.1:99999", "port 99999 is not in 0-65535"),
        ("127.0.0.1:", "expected HOST:PORT"),
        ("no-such-host.invalid:7443", "unknown host 'no-such-host.invalid'"),
        ("192.0.2.1:0", "cannot listen on 192.0.2.1:0"),  # not an address of this machine
        (":7443", "name the host (0.0.0.0:7443 or [::]:7443 for every address)"),
    ],
)
def test_a_bad_listen_address_is_one_line_and_creates_nothing(tmp_path: Path, listen: str, says: str) -> None:
    data_dir = tmp_path / "state"
    run = _serve(data_dir, "--listen", listen)
    assert run.returncode != 0
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("tether-controller: ") and says in lines[0], lines
    assert not data_dir.exists()


def test_a_bad_certificate_name_is_one_line_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """Found once the CA exists (the serving certificate is made from it): what this run created
    is removed again."""
    data_dir = tmp_path / "state"
    run = _serve(data_dir, "--listen", "127.0.0.1:0", "--san", "bad_\u00fc")
    assert run.returncode != 0
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and "invalid name for the serving certificate" in lines[0], run.stderr
    assert not data_dir.exists()


def test_a_port_in_use_is_one_line_and_creates_nothing(tmp_path: Path, busy_port: int) -> None:
    data_dir = tmp_path / "state"
    run = _serve(data_dir, "--listen", f"127.0.0.1:{busy_port}")
    assert run.returncode != 0
    assert run.stderr.splitlines() == [
        f"tether-controller: cannot listen on 127.0.0.1:{busy_port}: the port is already in use"
    ]
    assert not data_dir.exists()


def test_a_corrupt_store_is_one_line_naming_the_file(tmp_path: Path) -> None:
    data_dir = tmp_path / "state"
    data_dir.mkdir()
    db = data_dir / "tether.db"
    db.write_bytes(b"this is not a database" * 400)
    run = _serve(data_dir, "--listen", "127.0.0.1:0")
    assert run.returncode != 0
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("tether-controller: ") and str(db) in lines[0]
