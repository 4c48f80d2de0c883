"""scripts/check_api.py: buf lint and buf breaking pass on the tree and fail on what they guard.

buf comes from the npm registry (pinned, into .cache/buf); without npm this skips, except as
root or under CI=true, where it fails like the check itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.api_protos import copy_protos, edit, load_script

check_api = load_script("check_api")


@pytest.fixture(scope="module")
def buf() -> Path:
    try:
        return Path(check_api.ensure_buf())
    except check_api.Unavailable as exc:
        if check_api.must_have_buf():
            pytest.fail(f"buf is needed here: {exc}")
        pytest.skip(f"buf is not available: {exc}")


@pytest.mark.usefixtures("buf")
def test_the_tree_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_api.main([]) == 0
    assert "lint clean, no breaking change" in capsys.readouterr().out


@pytest.mark.usefixtures("buf")
def test_a_comments_only_copy_passes(tmp_path: Path) -> None:
    root = copy_protos(tmp_path)
    edit(root, "agent.proto", "  // The agent version: the one Plan.agent names.\n", "  // Reworded.\n")
    assert check_api.main(["--proto-root", str(root)]) == 0


@pytest.mark.usefixtures("buf")
def test_a_changed_field_type_is_breaking(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    root = copy_protos(tmp_path)
    edit(root, "admin.proto", "  uint64 expected_generation = 3;\n", "  int64 expected_generation = 3;\n")
    assert check_api.main(["--proto-root", str(root)]) == 1
    err = capfd.readouterr()
    assert "expected_generation" in err.out + err.err
    assert "changed incompatibly" in err.err


@pytest.mark.usefixtures("buf")
def test_a_removed_rpc_is_breaking(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    root = copy_protos(tmp_path)
    edit(
        root,
        "admin.proto",
        "  rpc ListAgentBundles(ListAgentBundlesRequest) returns (ListAgentBundlesResponse);\n",
        "",
    )
    assert check_api.main(["--proto-root", str(root)]) == 1
    assert "ListAgentBundles" in "".join(capfd.readouterr())


@pytest.mark.usefixtures("buf")
def test_lint_wants_a_comment_on_every_field(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    root = copy_protos(tmp_path)
    edit(root, "common.proto", "  // Total framebuffer memory in MiB.\n", "")
    assert check_api.main(["--proto-root", str(root)]) == 1
    err = capfd.readouterr()
    assert 'Field "memory_total_mib" should have a non-empty comment' in err.out + err.err
    assert "buf lint failed" in err.err


def test_without_buf_ci_fails_and_elsewhere_it_skips(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def unavailable() -> Path:
        raise check_api.Unavailable("npm is not installed")

    monkeypatch.setattr(check_api, "ensure_buf", unavailable)
    monkeypatch.setenv("CI", "true")
    assert check_api.main([]) == 1
    assert "API check failed: npm is not installed" in capsys.readouterr().err
    monkeypatch.setenv("CI", "")
    monkeypatch.setattr(check_api.os, "geteuid", lambda: 1000)
    assert check_api.main([]) == 0
    assert "API check skipped" in capsys.readouterr().err
