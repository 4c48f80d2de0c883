"""admin.conf with several controllers (contexts), and the plain single-controller file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether.controller.adminconf import AdminConfig, Contexts
from tether.controller.cli.client import load_config
from tether.controller.errors import InvalidArgument

PEM = "-----BEGIN X-----\nAAAA\n-----END X-----\n"


def conf(address: str, name: str = "alice") -> AdminConfig:
    return AdminConfig(address, "sha256:aa", PEM.encode(), PEM.encode(), PEM.encode(), name, "admin")


def test_a_plain_file_reads_as_before_and_as_one_context(tmp_path: Path) -> None:
    path = tmp_path / "admin.conf"
    conf("10.0.0.1:7443").write(path)
    assert path.stat().st_mode & 0o777 == 0o600
    read = AdminConfig.read(path)
    assert (read.controller, read.name, read.key_pem) == ("10.0.0.1:7443", "alice", PEM.encode())
    assert Contexts.read(path).names() == ["default"]
    with pytest.raises(InvalidArgument, match="has no contexts"):
        AdminConfig.read(path, "lab")


def test_contexts_pick_by_name_else_the_current_one(tmp_path: Path) -> None:
    path = tmp_path / "admin.conf"
    Contexts(()).with_context(conf("10.0.0.1:7443"), "lab").with_context(
        conf("10.0.0.2:7443", "bob"), "prod"
    ).write(path)
    text = path.read_text()
    assert "current-context: lab" in text and "user: bob" in text and "certificate: |" in text
    assert AdminConfig.read(path).controller == "10.0.0.1:7443"
    prod = AdminConfig.read(path, "prod")
    assert (prod.controller, prod.name, prod.context) == ("10.0.0.2:7443", "bob", "prod")
    Contexts.read(path).use("prod", path).write(path)
    assert AdminConfig.read(path).controller == "10.0.0.2:7443"
    with pytest.raises(InvalidArgument, match=r"no context 'nope' \(it has: lab, prod\)"):
        AdminConfig.read(path, "nope")
    # replacing a context keeps one of that name
    again = Contexts.read(path).with_context(conf("10.0.0.3:7443"), "lab")
    assert again.names() == ["prod", "lab"] and again.current == "prod"


def test_no_current_context_asks_for_one(tmp_path: Path) -> None:
    path = tmp_path / "admin.conf"
    path.write_text(
        "kind: AdminConfig\ncontexts:\n  - name: x\n    controller: a:1\n"
        "    ca: x\n    certificate: x\n    key: x\n"
    )
    path.chmod(0o600)
    with pytest.raises(InvalidArgument, match="no current-context: pick one with --context"):
        AdminConfig.read(path)
    assert AdminConfig.read(path, "x").controller == "a:1"
    path.write_text("contexts:\n  - name: x\n    controller: a:1\n")
    with pytest.raises(InvalidArgument, match="context 'x', is not valid: missing 'ca'"):
        AdminConfig.read(path, "x")


def test_flag_beats_variable_beats_current(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    path = tmp_path / "admin.conf"
    Contexts(()).with_context(conf("a:1"), "a").with_context(conf("b:2"), "b").write(path)
    args = argparse.Namespace(config=str(path), context=None)
    monkeypatch.delenv("TETHER_CONTEXT", raising=False)
    assert load_config(args).controller == "a:1"
    monkeypatch.setenv("TETHER_CONTEXT", "b")
    assert load_config(args).controller == "b:2"
    args.context = "a"
    assert load_config(args).controller == "a:1"
