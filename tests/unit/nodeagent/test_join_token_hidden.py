"""Issue 10, item 13: the join token leaves neither the command line nor the environment behind."""

from __future__ import annotations

import os

import pytest

from tether.nodeagent.config import TOKEN_ENV
from tether.nodeagent.main import main, scrubbed_argv

TOKEN = "k7q2zp.c4n4ryc4n4ryc4n4ryc4n4ryc4n4ry01"


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--token", TOKEN, "--ca-hash", "sha256:x"],
        ["run", f"--token={TOKEN}", "--ca-hash", "sha256:x"],
        ["run", "--ca-hash", "sha256:x", "--token", TOKEN],
    ],
)
def test_the_reexec_argv_drops_the_token_in_every_form(argv: list[str]) -> None:
    out = scrubbed_argv(["/usr/bin/python3", "/opt/tether/bin/tether-agent", *argv])
    assert TOKEN not in " ".join(out) and "--token" not in out
    assert out[:3] == ["/usr/bin/python3", "/opt/tether/bin/tether-agent", "run"]
    assert "--ca-hash" in out and "sha256:x" in out


def test_the_token_file_flag_is_kept() -> None:
    argv = ["run", "--token-file", "/etc/tether/join-token", "--state-dir", "/var/lib/tether"]
    assert scrubbed_argv(argv) == argv


def test_the_token_is_taken_out_of_the_environment_once_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert main(["validate-config", "--controller", "127.0.0.1:7443"]) == 0
    assert TOKEN_ENV not in os.environ  # no step, no child process inherits it
