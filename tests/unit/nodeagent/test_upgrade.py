"""Self-upgrade on disk: finding the install, staging, the switch, commit, and the launcher's rollback
(the real shell launcher the bootstrap writes, run with sh; the "interpreter" is a stub script)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from tether import nodeagent
from tether.bootstrap.layout import Layout, launcher
from tether.nodeagent import upgrade
from tether.nodeagent.limits import UPGRADE_MAX_STARTS
from tether.nodeagent.model import AgentTarget
from tether.nodeagent.upgrade import Install, UpgradeError


def archive(version: str, *, python: str = "", arch: str = "", extra: bytes = b"") -> bytes:
    run_python, run_arch = upgrade.running_platform()
    manifest = {"tether_version": version, "python": python or run_python, "arch": arch or run_arch}
    files = {
        "BUNDLE.json": json.dumps(manifest).encode(),
        "launch.py": b"print('launch')\n" + extra,
        "lib/tether/nodeagent/__init__.py": f"__version__ = {version!r}\n".encode(),
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def target_of(data: bytes, version: str) -> AgentTarget:
    return AgentTarget(version, hashlib.sha256(data).hexdigest(), len(data))


def installed(tmp_path: Path, version: str = "1.0") -> Install:
    """An agents directory as the bootstrap leaves it: one bundle, ``current`` pointing at it."""
    agents = tmp_path / "opt/agent"
    data = archive(version)
    bid = upgrade.bundle_id(hashlib.sha256(data).hexdigest())
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(agents / bid, filter="data")
    os.symlink(bid, agents / "current")
    return Install(agents, bid)


def staged(install: Install, version: str) -> tuple[AgentTarget, str]:
    data = archive(version)
    target = target_of(data, version)
    path = install.download(target)
    path.write_bytes(data)
    return target, upgrade.stage(install, target, path)


def test_an_install_is_found_from_the_module_path_and_a_checkout_is_not(tmp_path: Path) -> None:
    install = installed(tmp_path)
    module = install.agents_dir / install.bundle_id / "lib/tether/nodeagent/__init__.py"
    assert Install.find(str(module)) == install
    assert Install.find(nodeagent.__file__) is None  # this source checkout
    os.remove(install.agents_dir / "current")
    assert Install.find(str(module)) is None


def test_staging_unpacks_beside_the_running_bundle_and_checks_the_manifest(tmp_path: Path) -> None:
    install = installed(tmp_path)
    target, bid = staged(install, "2.0")
    assert bid == target.sha256[:16] != install.bundle_id
    assert (
        install.agents_dir / bid / "lib/tether/nodeagent/__init__.py"
    ).read_text() == "__version__ = '2.0'\n"
    assert (install.agents_dir / install.bundle_id / "BUNDLE.json").is_file()  # the old one stays
    assert not install.download(target).exists()
    assert os.readlink(install.path("current")) == install.bundle_id  # not switched yet

    for version_named, data in (
        ("3.0", archive("3.1")),  # the manifest says another version
        ("3.0", archive("3.0", python="2.7")),  # another interpreter
        ("3.0", archive("3.0", arch="s390x")),
    ):
        t = target_of(data, version_named)
        install.download(t).write_bytes(data)
        with pytest.raises(UpgradeError) as err:
            upgrade.stage(install, t, install.download(t))
        assert not err.value.retryable
        assert not (install.agents_dir / t.sha256[:16]).exists()


def test_switch_then_commit_leaves_only_the_new_bundle(tmp_path: Path) -> None:
    install = installed(tmp_path)
    target, bid = staged(install, "2.0")
    pending = upgrade.new_pending(install, target, bid, 300)
    upgrade.switch(install, pending)
    assert os.readlink(install.path("current")) == bid
    assert upgrade.read_pending(install) == pending
    assert pending.from_version == nodeagent.__version__ and pending.deadline >= time.time() + 299

    new = Install(install.agents_dir, bid)
    start = upgrade.on_start(new)
    assert start.upgraded_from == nodeagent.__version__ and start.deadline == pending.deadline
    upgrade.commit(new)
    assert sorted(p.name for p in install.agents_dir.iterdir()) == sorted([bid, "current"])
    assert upgrade.on_start(new) == upgrade.Startup()


def test_a_pending_record_found_by_the_old_bundle_is_cleared(tmp_path: Path) -> None:
    """The agent crashed between writing the record and switching: nothing is on probation."""
    install = installed(tmp_path)
    target, bid = staged(install, "2.0")
    upgrade.switch(install, upgrade.new_pending(install, target, bid, 300))
    os.replace(install.path("current"), install.path("old-link"))
    os.symlink(install.bundle_id, install.path("current"))
    start = upgrade.on_start(install)
    assert start.deadline == 0 and not start.upgraded_from
    assert upgrade.read_pending(install) is None


# -- the launcher ----------------------------------------------------------------------------


def launch(tmp_path: Path, install: Install, *args: str) -> subprocess.CompletedProcess[str]:
    """The bootstrap's launcher with a stub interpreter that prints which bundle it was asked to run."""
    stub = tmp_path / "python"
    stub.write_text('#!/bin/sh\nshift\nreadlink -f "$1"\n')
    stub.chmod(0o755)
    script = tmp_path / "tether-agent"
    layout = Layout(opt_dir=str(install.agents_dir.parent))
    script.write_bytes(launcher(layout, str(stub)))
    script.chmod(0o755)
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=30, check=True)


def ran(out: subprocess.CompletedProcess[str]) -> str:
    return Path(out.stdout.strip()).parent.name


def test_the_launcher_rolls_back_after_too_many_starts(tmp_path: Path) -> None:
    install = installed(tmp_path)
    old = install.bundle_id
    target, bid = staged(install, "2.0")
    upgrade.switch(install, upgrade.new_pending(install, target, bid, 300))
    for _ in range(UPGRADE_MAX_STARTS):  # the new bundle keeps crashing: systemd starts it again
        assert ran(launch(tmp_path, install, "run")) == bid
    assert ran(launch(tmp_path, install, "version")) == bid  # only `run` counts
    out = launch(tmp_path, install, "run")
    assert ran(out) == old
    assert "rolled back" in out.stderr and f"did not start ({UPGRADE_MAX_STARTS} starts)" in out.stderr
    assert os.readlink(install.path("current")) == old
    assert upgrade.read_pending(install) is None and not install.path(upgrade.STARTS).exists()
    record = upgrade.read_rolled_back(install)
    assert record is not None and (record.version, record.sha256) == ("2.0", target.sha256)
    start = upgrade.on_start(Install(install.agents_dir, old))
    assert start.rolled_back == record and start.deadline == 0
    assert ran(launch(tmp_path, install, "run")) == old  # and stays there


def test_the_launcher_rolls_back_once_the_deadline_has_passed(tmp_path: Path) -> None:
    install = installed(tmp_path)
    target, bid = staged(install, "2.0")
    upgrade.switch(install, upgrade.new_pending(install, target, bid, -1))
    out = launch(tmp_path, install, "run")
    assert ran(out) == install.bundle_id
    record = upgrade.read_rolled_back(install)
    assert record is not None and "deadline" in record.reason


def test_the_launcher_runs_the_new_bundle_while_it_is_on_probation_and_after_commit(tmp_path: Path) -> None:
    install = installed(tmp_path)
    target, bid = staged(install, "2.0")
    upgrade.switch(install, upgrade.new_pending(install, target, bid, 300))
    assert ran(launch(tmp_path, install, "run")) == bid
    upgrade.commit(Install(install.agents_dir, bid))
    for _ in range(UPGRADE_MAX_STARTS + 2):
        assert ran(launch(tmp_path, install, "run")) == bid
    assert upgrade.read_rolled_back(install) is None
