"""Run pieces of rendered scripts under bash with external commands stubbed (via BASH_ENV
functions, which take precedence over the PATH the scripts set)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from tests.unit.render import scenarios


def library(os_key: str = "ubuntu-22.04") -> str:
    """The shared library as rendered for ``os_key``, without its final OS check."""
    script = scenarios.plan_for("kernel", os_key).steps[0].script
    lib, _ = scenarios.library_of(script)
    return lib.removesuffix("check_os\n")


def run_bash(
    tmp: Path,
    body: str,
    *,
    stubs: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run ``body`` with each stub ``name -> bash function body`` shadowing the real command."""
    stub_file = tmp / "stubs.sh"
    stub_file.write_text("".join(f"{name}() {{ {code}\n}}\n" for name, code in (stubs or {}).items()))
    script = tmp / "script.sh"
    script.write_text(body)
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    full_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "BASH_ENV": str(stub_file),
        "TETHER_PROVENANCE": str(tmp / "provenance"),
        "TETHER_WORKDIR": str(work),
        **(env or {}),
    }
    return subprocess.run(
        ["bash", str(script)],
        stdin=subprocess.DEVNULL,  # a script never reads the test runner's input
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        check=False,
    )


def curl_serving(files: dict[str, bytes], tmp: Path) -> str:
    """A curl stub: ``-o DEST URL`` copies the file registered for URL (or fails like curl -f)."""
    served = tmp / "served"
    served.mkdir()
    for i, (url, data) in enumerate(files.items()):
        (served / str(i)).write_bytes(data)
        (served / f"{i}.url").write_text(url)
    return (
        'local dest="" url="" a; while (($#)); do case $1 in -o) dest=$2; shift 2 ;; -*) shift ;; '
        "*) url=$1; shift ;; esac; done; "
        f'for u in {served}/*.url; do if [[ $(cat "$u") == "$url" ]]; then cp "${{u%.url}}" "$dest"; '
        'echo "$url" >>"$TETHER_WORKDIR/fetched"; return 0; fi; done; return 22'
    )


def provenance(tmp: Path) -> dict[str, str]:
    path = tmp / "provenance"
    if not path.exists():
        return {}
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
