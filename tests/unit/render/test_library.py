"""The shared library's helpers, run for real under bash with external commands stubbed."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from tests.unit.render.shellrun import curl_serving, library, run_bash


@pytest.mark.parametrize(
    ("installed", "want", "ok"),
    [
        ("1.7.27-1", "1.7.27", True),
        ("5:27.3.1-1~ubuntu.22.04~jammy", "27.3.1", True),
        ("1.7.270-1", "1.7.27", False),
        ("1.7.28-1", "1.7.27", False),
        ("v1.35.3", "1.35.3", True),
        ("580.65.06", "580", True),
        ("5800.1", "580", False),
    ],
)
def test_version_matches(tmp_path: Path, installed: str, want: str, ok: bool) -> None:
    out = run_bash(tmp_path, library() + f'version_matches "{installed}" "{want}"\n')
    assert (out.returncode == 0) is ok, out.stderr


def test_mirror_rewrites_https_downloads(tmp_path: Path) -> None:
    lib = library().replace("TETHER_MIRROR=''", "TETHER_MIRROR=http://mirror.local/base")
    out = run_bash(tmp_path, lib + "mirror_url https://github.com/a/b/c.tgz\nmirror_url http://x/y\n")
    assert out.stdout.splitlines() == ["http://mirror.local/base/github.com/a/b/c.tgz", "http://x/y"]


def test_fetch_verified_accepts_the_right_file(tmp_path: Path) -> None:
    data = b"payload"
    curl = curl_serving({"https://x.test/f": data}, tmp_path)
    sha = hashlib.sha256(data).hexdigest()
    out = run_bash(
        tmp_path,
        library() + f'fetch_verified https://x.test/f "$TETHER_WORKDIR/f" {sha}\n',
        stubs={"curl": curl},
    )
    assert out.returncode == 0, out.stderr


def test_fetch_verified_refuses_a_tampered_file(tmp_path: Path) -> None:
    curl = curl_serving({"https://x.test/f": b"tampered"}, tmp_path)
    sha = hashlib.sha256(b"payload").hexdigest()
    out = run_bash(
        tmp_path,
        library() + f'fetch_verified https://x.test/f "$TETHER_WORKDIR/f" {sha}\necho after\n',
        stubs={"curl": curl},
    )
    assert out.returncode == 1
    assert "checksum mismatch" in out.stderr
    assert "after" not in out.stdout


def test_fetch_verified_uses_the_published_checksum(tmp_path: Path) -> None:
    data = b"tarball"
    sums = f"{hashlib.sha256(b'other').hexdigest()}  other.tgz\n{hashlib.sha256(data).hexdigest()}  f.tgz\n"
    curl = curl_serving({"https://x.test/f.tgz": data, "https://x.test/SUMS": sums.encode()}, tmp_path)
    body = (
        library() + 'fetch_verified https://x.test/f.tgz "$TETHER_WORKDIR/f" published:https://x.test/SUMS\n'
    )
    assert run_bash(tmp_path, body, stubs={"curl": curl}).returncode == 0
    other = tmp_path / "second"
    other.mkdir()
    bad = {"https://x.test/f.tgz": b"evil", "https://x.test/SUMS": sums.encode()}
    out = run_bash(other, body, stubs={"curl": curl_serving(bad, other)})
    assert out.returncode == 1
    assert "checksum mismatch" in out.stderr


def test_fetch_goes_through_the_mirror(tmp_path: Path) -> None:
    data = b"x"
    curl = curl_serving({"http://m.test/x.test/f": data}, tmp_path)
    lib = library().replace("TETHER_MIRROR=''", "TETHER_MIRROR=http://m.test")
    sha = hashlib.sha256(data).hexdigest()
    out = run_bash(
        tmp_path, lib + f'fetch_verified https://x.test/f "$TETHER_WORKDIR/f" {sha}\n', stubs={"curl": curl}
    )
    assert out.returncode == 0, out.stderr


def test_install_file_changes_only_when_different(tmp_path: Path) -> None:
    target = tmp_path / "etc" / "conf"
    body = library() + (
        f"printf 'a\\n' | install_file {target} 0644 && echo changed1\n"
        f"printf 'a\\n' | install_file {target} 0644 && echo changed2\n"
        f"printf 'b\\n' | install_file {target} 0600 && echo changed3\n"
        "true\n"
    )
    out = run_bash(tmp_path, body)
    assert out.returncode == 0, out.stderr
    assert [ln for ln in out.stdout.splitlines() if ln.startswith("changed")] == ["changed1", "changed3"]
    assert target.read_text() == "b\n"
    assert oct(target.stat().st_mode & 0o777) == "0o600"


def test_pinned_install_fails_loudly_when_the_pin_is_missing(tmp_path: Path) -> None:
    stubs = {
        "apt-cache": "printf ' containerd.io | 1.7.28-1 | repo\\n containerd.io | 1.7.26-1 | repo\\n'",
        "apt-get": 'echo "apt-get $*" >>"$TETHER_WORKDIR/calls"',
    }
    out = run_bash(tmp_path, library() + "pkg_install_pinned 1.7.27 containerd.io\n", stubs=stubs)
    assert out.returncode == 1
    assert "containerd.io 1.7.27 is not available" in out.stderr
    assert not (tmp_path / "work" / "calls").exists()  # nothing installed: no fallback to latest


def test_pinned_install_installs_exactly_the_pin(tmp_path: Path) -> None:
    stubs = {
        "apt-cache": "printf ' containerd.io | 1.7.28-1 | repo\\n containerd.io | 1.7.27-1 | repo\\n'",
        "apt-get": 'echo "$*" >>"$TETHER_WORKDIR/calls"',
    }
    out = run_bash(tmp_path, library() + "pkg_install_pinned 1.7.27 containerd.io\n", stubs=stubs)
    assert out.returncode == 0, out.stderr
    assert "containerd.io=1.7.27-1" in (tmp_path / "work" / "calls").read_text()


def test_dnf_repositories_are_never_unauthenticated(tmp_path: Path) -> None:
    out = run_bash(tmp_path, library("rocky-9") + "add_repo x /k https://r.test 0 0\n")
    assert out.returncode == 1
    assert "would not be authenticated" in out.stderr


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def upstream(tmp_path: Path) -> Path:
    repo = tmp_path / "upstream"
    repo.mkdir()
    _git("init", "-q", "-b", "main", cwd=repo)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "one", cwd=repo)
    _git("tag", "-a", "v1.0", "-m", "v1.0", cwd=repo)
    _git("config", "uploadpack.allowReachableSHA1InWant", "true", cwd=repo)
    return repo


def test_git_sources_check_out_the_resolved_commit(tmp_path: Path, upstream: Path) -> None:
    head = _git("rev-parse", "HEAD", cwd=upstream)
    dest = tmp_path / "src"
    body = library() + (
        f'sha=$(git_resolve file://{upstream} v1.0)\necho "sha=$sha"\n'
        f'git_checkout file://{upstream} v1.0 "$sha" {dest}\ngit -C {dest} rev-parse HEAD\n'
    )
    out = run_bash(tmp_path, body)
    assert out.returncode == 0, out.stderr
    assert f"sha={head}" in out.stdout  # the annotated tag is peeled to its commit
    assert out.stdout.splitlines()[-1] == head


def test_git_checkout_refuses_a_ref_that_moved(tmp_path: Path, upstream: Path) -> None:
    """The commit resolved earlier is gone and the ref now names another: fail, never build it."""
    resolved = "0" * 40
    body = library() + f"git_checkout file://{upstream} main {resolved} {tmp_path / 'src'}\n"
    out = run_bash(tmp_path, body)
    assert out.returncode == 1
    assert "moved while it was fetched" in out.stderr
