"""The node agent never imports rich (tetherctl's terminal library), and runs where it is absent.

Every nodeagent module is imported in a fresh interpreter where ``rich`` cannot be found (as in the
agent's bundle, which does not carry it); an import hook records who asked for it. structlog looks
for rich by itself (an optional pretty printer) and does without; no module of the agent asks.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROGRAM = """
import importlib, json, pkgutil, sys

asked = []

class NoRich:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] != "rich":
            return None
        frame = sys._getframe(1)
        while frame and frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen")):
            frame = frame.f_back
        asked.append(frame.f_globals.get("__name__", "?") if frame else "?")
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoRich())
from tether import nodeagent
EXTRA
names = [m.name for m in pkgutil.walk_packages(nodeagent.__path__, "tether.nodeagent.")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"modules": len(names), "asked": sorted(set(asked)),
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] == "rich")}))
"""


def run(extra: str = "") -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM.replace("EXTRA", extra)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_no_agent_module_imports_rich() -> None:
    got = run()
    assert int(got["modules"]) > 20  # type: ignore[call-overload]
    assert got["loaded"] == []
    assert not [m for m in got["asked"] if m.startswith("tether.nodeagent")]  # type: ignore[attr-defined]
    assert all(m.startswith("structlog.") for m in got["asked"])  # type: ignore[attr-defined]


def test_the_agent_bundle_does_not_carry_rich() -> None:
    from tether.bootstrap.bundle import REQUIREMENTS

    assert "rich" not in REQUIREMENTS and "structlog" in REQUIREMENTS


def test_the_hook_names_a_module_that_does_import_rich() -> None:
    with pytest.raises(subprocess.CalledProcessError) as failed:  # tetherctl's progress needs rich
        run("import tether.bootstrap.progress")
    assert "No module named 'rich'" in failed.value.stderr
