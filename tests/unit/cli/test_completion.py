"""Completion scripts generated from the parser, run in the real shells."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tether.controller.cli.completion import tables
from tether.controller.cli.main import _parser, main

CASES = [
    (["tetherctl", ""], {"env", "node", "token", "version", "completion", "config"}),
    (["tetherctl", "en"], {"env"}),
    (["tetherctl", "--context", "lab", "no"], {"node"}),
    (["tetherctl", "env", ""], {"apply", "get", "list", "delete", "diff", "validate", "render"}),
    (["tetherctl", "env", "get", "x", "-o", ""], {"yaml", "json"}),
    (["tetherctl", "node", "list", "--output", "w"], {"wide"}),
    (["tetherctl", "completion", ""], {"bash", "zsh", "fish"}),
    (["tetherctl", "token", "list", "--e"], {"--env"}),
]


def script(shell: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert main(["completion", shell]) == 0
    path = tmp_path / f"tetherctl.{shell}"
    path.write_text(capsys.readouterr().out)
    return path


def test_tables_follow_the_parser() -> None:
    t = tables(_parser()).data
    assert "apply" in t["subs"]["tetherctl env"]
    assert {"-f", "--file", "--dry-run"} <= set(t["opts"]["tetherctl env apply"])
    assert "--dry-run" not in t["valued"]["tetherctl env apply"]  # a flag takes no value
    assert t["choices"]["tetherctl node list -o"] == ["table", "wide", "json", "yaml"]
    assert t["args"]["tetherctl completion"] == ["bash", "zsh", "fish"]


def test_bash_completes_commands_options_and_choices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = script("bash", tmp_path, capsys)
    (tmp_path / "f.yaml").write_text("")
    cases = [*CASES, (["tetherctl", "env", "apply", "-f", f"{tmp_path}/f."], {f"{tmp_path}/f.yaml"})]
    for words, want in cases:
        quoted = " ".join(f"'{w}'" for w in words)
        prog = (
            f"source {path}; COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _tetherctl; "
            'printf "%s\\n" "${COMPREPLY[@]}"'
        )
        out = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, check=True).stdout
        assert set(out.split()) >= want and all(w.startswith(words[-1]) for w in out.split()), words


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed (scripts/system-deps)")
def test_zsh_completes_the_same(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = script("zsh", tmp_path, capsys)
    subprocess.run(["zsh", "-n", str(path)], check=True)
    for words, want in CASES:
        quoted = " ".join(f"'{w}'" for w in words)
        prog = (
            f"compdef() {{ : }}; source {path}; compadd() {{ shift; print -l -- $@ }}; "
            f"words=({quoted}); CURRENT={len(words)}; _tetherctl"
        )
        out = subprocess.run(["zsh", "-fc", prog], capture_output=True, text=True, check=True).stdout
        got = {w for w in out.split() if w.startswith(words[-1])}  # compadd filters by prefix itself
        assert got >= want, words


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed (scripts/system-deps)")
def test_fish_completes_the_same(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = script("fish", tmp_path, capsys)
    subprocess.run(["fish", "-n", str(path)], check=True)
    for words, want in CASES:
        line = " ".join(words)
        prog = f"source {path}; complete -C '{line}'"
        out = subprocess.run(["fish", "-c", prog], capture_output=True, text=True, check=True).stdout
        got = {ln.split("\t")[0] for ln in out.splitlines()}
        assert got >= {w for w in want}, words
