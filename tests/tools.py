"""System tools the tests run (shellcheck, promtool): missing is a failure as root, where
scripts/system-deps installs them, and a skip with the reason elsewhere."""

from __future__ import annotations

import os
import shutil

import pytest


def system_tool(name: str, package: str = "") -> str:
    """The path of ``name``; fails as root when it is missing, skips otherwise."""
    exe = shutil.which(name)
    if exe is None:
        if os.geteuid() != 0:
            pytest.skip(f"{name} is not installed and this is not root (run scripts/system-deps as root)")
        from_package = f" (Debian's {package} package)" if package else ""
        pytest.fail(f"{name} is missing: scripts/system-deps installs it{from_package}")
    return exe
