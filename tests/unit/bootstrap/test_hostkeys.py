"""Host key decisions: pinned, known, changed (always refused), unknown (TOFU only when asked)."""

from __future__ import annotations

from pathlib import Path

import asyncssh
import pytest

from tether.bootstrap.errors import HostKeyError
from tether.bootstrap.hostkeys import HostKeyPolicy, HostKeyVerifier, fingerprint, host_pattern


def key() -> asyncssh.SSHKey:
    return asyncssh.generate_private_key("ssh-ed25519")


def line(k: asyncssh.SSHKey) -> str:
    return " ".join(k.export_public_key().decode().split()[:2])


def test_a_pinned_key_is_the_only_key_accepted() -> None:
    good, bad = key(), key()
    v = HostKeyVerifier(HostKeyPolicy(pinned=line(good) + " comment"), "10.0.0.5", 22)
    assert v.known_hosts.match("10.0.0.5", "10.0.0.5", None)[0] == [good.convert_to_public()]
    assert not v.validate("10.0.0.5", "10.0.0.5", 22, bad.convert_to_public())
    assert "host key mismatch" in v.problem
    assert fingerprint(bad) in v.problem and fingerprint(good) in v.problem


def test_a_changed_key_is_refused_even_when_new_keys_are_accepted(tmp_path: Path) -> None:
    known, presented = key(), key()
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[10.0.0.5]:2222 {line(known)}\n")
    v = HostKeyVerifier(HostKeyPolicy(known_hosts=(kh,), accept_new=True), "10.0.0.5", 2222)
    assert not v.validate("10.0.0.5", "10.0.0.5", 2222, presented.convert_to_public())
    assert "CHANGED" in v.problem
    assert kh.read_text() == f"[10.0.0.5]:2222 {line(known)}\n"  # untouched


def test_an_unknown_host_is_refused_unless_asked_then_recorded_once(tmp_path: Path) -> None:
    kh = tmp_path / "sub" / "known_hosts"
    new = key()
    strict = HostKeyVerifier(HostKeyPolicy(known_hosts=(kh,)), "node1", 22)
    assert not strict.validate("node1", "10.0.0.9", 22, new.convert_to_public())
    assert "unknown host key" in strict.problem and "--accept-new-host-key" in strict.problem
    assert not kh.exists()
    for _ in range(2):
        tofu = HostKeyVerifier(HostKeyPolicy(known_hosts=(kh,), accept_new=True), "node1", 22)
        assert tofu.validate("node1", "10.0.0.9", 22, new.convert_to_public())
    assert kh.read_text() == f"node1 {line(new)}\n"
    assert oct(kh.stat().st_mode & 0o777) == "0o600"
    # The recorded key now verifies the host the normal way.
    known = HostKeyVerifier(HostKeyPolicy(known_hosts=(kh,)), "node1", 22).known_hosts
    assert known.match("node1", "10.0.0.9", None)[0]


def test_bad_inputs_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(HostKeyError, match="expected 'TYPE BASE64'"):
        HostKeyVerifier(HostKeyPolicy(pinned="garbage"), "h", 22)
    with pytest.raises(HostKeyError, match="invalid pinned host key"):
        HostKeyVerifier(HostKeyPolicy(pinned="ssh-ed25519 bm90IGEga2V5"), "h", 22)
    assert host_pattern("h", 22) == "h" and host_pattern("h", 2200) == "[h]:2200"


def test_the_jump_host_policy_never_inherits_the_pin(tmp_path: Path) -> None:
    policy = HostKeyPolicy(known_hosts=(tmp_path / "kh",), pinned="ssh-ed25519 AAAA", accept_new=True)
    jump = policy.without_pin()
    assert jump.pinned == "" and jump.accept_new and jump.known_hosts == policy.known_hosts
