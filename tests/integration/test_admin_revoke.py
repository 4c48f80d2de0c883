"""An operator revokes an admin certificate on the controller's host; the running controller refuses it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.integration.harness import BIN, Controller, wait_for


def admin(controller: Controller, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "tether-controller"), "admin", *args, "--data-dir", str(controller.data_dir)],
        capture_output=True,
        text=True,
        check=check,
        timeout=60,
    )


def test_revoked_admin_is_refused_by_the_running_controller(controller: Controller, tmp_path: Path) -> None:
    bob = tmp_path / "bob.conf"
    issued = admin(controller, "issue", "--name", "bob", "--role", "admin", "--out", str(bob))
    fingerprint = issued.stdout.strip().rsplit("(", 1)[1].rstrip(")")
    assert controller.ctl("--config", str(bob), "env", "list").returncode == 0

    listed = admin(controller, "list").stdout
    assert "bob" in listed and fingerprint in listed  # the first start's admin.conf is listed too
    assert len(listed.strip().splitlines()) == 3

    revoked = admin(controller, "revoke", "--name", "bob")
    assert f"revoked {fingerprint}" in revoked.stdout

    def refused() -> bool:
        out = controller.ctl("--config", str(bob), "env", "list", check=False)
        return out.returncode != 0 and "revoked" in out.stderr

    wait_for(refused, timeout=15, what="bob's certificate refused")
    assert controller.ctl("env", "list").returncode == 0  # the other admins are untouched
    again = admin(controller, "revoke", "--name", "bob", check=False)
    assert again.returncode == 1 and "no unrevoked admin certificate issued to 'bob'" in again.stderr
    assert "PRIVATE KEY" not in (controller.data_dir / "pki" / "admins.json").read_text()
