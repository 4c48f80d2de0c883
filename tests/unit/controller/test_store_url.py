"""A --store URL's password never reaches a message, a traceback or a log line: psycopg names the
URL's text (password included) when it cannot parse it, so ``serve``, ``migrate`` and the admin CLI
say one fixed line instead; the password of a URL that parses is masked in every log line."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from tether.controller import server
from tether.controller.config import ControllerConfig
from tether.controller.errors import StoreError
from tether.controller.identity.keyfile import create_key_file
from tether.controller.main import main
from tether.controller.store.pgconn import passwords
from tether.nodeagent.secrets import PROCESS_REDACTOR

CANARY_URL = "postgresql://u:ab%zzCANARY@127.0.0.1:1/db"  # "%zz": not percent-encoding
LINE = "tether-controller: invalid --store URL: check its form and percent-encoding"


def test_migrate_with_a_url_that_does_not_parse_says_one_line_without_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["migrate", "--store", CANARY_URL]) == 1
    out = capsys.readouterr()
    assert out.err.splitlines() == [LINE] and out.out == ""


@pytest.mark.parametrize("verb", [["list"], ["revoke", "--name", "bob"]])
def test_the_admin_cli_with_a_url_that_does_not_parse_says_one_line_without_the_password(
    verb: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "store.key"
    assert create_key_file(key) is not None
    assert main(["admin", *verb, "--store", CANARY_URL, "--store-key-file", str(key)]) == 1
    out = capsys.readouterr()
    assert out.err.splitlines() == [LINE] and out.out == ""


def test_serve_with_a_url_that_does_not_parse_says_one_line_and_makes_no_key_file(tmp_path: Path) -> None:
    key = tmp_path / "keys" / "store.key"
    run = "import sys; from tether.controller.main import main; sys.exit(main(sys.argv[1:]))"
    args = ["serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "d")]
    args += ["--store", CANARY_URL, "--store-key-file", str(key)]
    out = subprocess.run(
        [sys.executable, "-c", run, *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 1
    assert out.stderr.splitlines() == [LINE] and "CANARY" not in out.stdout
    assert not key.exists() and not (tmp_path / "d").exists()


def test_the_password_of_a_url_that_parses_is_masked_in_log_lines_and_messages(tmp_path: Path) -> None:
    url = "postgresql://u:p%40ss-CANARY-7@127.0.0.1:1/db"  # nothing listens on port 1
    config = ControllerConfig(tmp_path / "d", store=url, store_key_file=tmp_path / "store.key")
    try:
        with pytest.raises(StoreError, match=r"^store unavailable: ") as err:
            asyncio.run(server._open_store(config))
        assert "CANARY" not in str(err.value)
        masked = PROCESS_REDACTOR.redact(f"connecting to {url} with p@ss-CANARY-7")
        assert "CANARY" not in masked, masked
    finally:
        PROCESS_REDACTOR.discard(*passwords(url))
    assert passwords(url) == ["p%40ss-CANARY-7", "p@ss-CANARY-7"]
