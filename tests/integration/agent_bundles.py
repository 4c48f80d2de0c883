"""Agent bundles of another version for upgrade tests: this source with ``__version__`` changed,
built by the real bundle builder in a subprocess (so the manifest and the code both say it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import tether
from tether import nodeagent

BUILD = """
import asyncio, sys
from tether.bootstrap.bundle import BundleBuilder, BundleSpec
from tether import nodeagent
assert nodeagent.__version__ == sys.argv[1], nodeagent.__file__
b = asyncio.run(BundleBuilder().get(BundleSpec(sys.argv[2], sys.argv[3])))
print(b.path)
"""


def build_version(version: str, workdir: Path, python: str = "", arch: str = "amd64") -> Path:
    """A bundle of ``version`` (the bundle cache keeps it: a second build is quick)."""
    src = workdir / f"src-{version}"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(  # the whole package (links followed): this copy's nodeagent is the one found
        Path(tether.__file__).parent, src / "tether", ignore=shutil.ignore_patterns("__pycache__")
    )
    init = src / "tether/nodeagent/__init__.py"
    text = init.read_text()
    assert f'__version__ = "{nodeagent.__version__}"' in text
    init.write_text(text.replace(f'__version__ = "{nodeagent.__version__}"', f'__version__ = "{version}"'))
    python = python or f"{sys.version_info[0]}.{sys.version_info[1]}"
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", BUILD, version, python, arch],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
        cwd=src,  # not this checkout: its nodeagent would come first
    )
    assert out.returncode == 0, out.stderr
    return Path(out.stdout.strip().splitlines()[-1])
