"""scripts/one_package.py: one top-level import package (tether), by rules, idempotent."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "one_package.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("one_package", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["one_package"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


one = load()
MODULES = {"controller", "controller.main", "controller.cli", "controller.cli.main", "nodeagent"}
MODULES |= {"nodeagent.main", "nodeagent.config", "bootstrap", "bootstrap.bundle"}


def py(text: str) -> str:
    return str(one.rewrite_python(text, "x.py", one.Rules(set(MODULES), 110)))


def test_imports_are_rewritten_and_names_stay_bound() -> None:
    assert py("from controller.cli import main\n") == "from tether.controller.cli import main\n"
    assert py("import nodeagent\n") == "from tether import nodeagent\n"
    assert py("    import nodeagent as na  # why\n") == "    from tether import nodeagent as na  # why\n"
    assert py("import bootstrap.bundle\n") == "import tether.bootstrap.bundle\nfrom tether import bootstrap\n"
    assert py("from tether.v1 import agent_pb2\n") == "from tether.v1 import agent_pb2\n"


def test_references_in_strings_and_comments_only_when_they_name_a_module() -> None:
    src = (
        'monkeypatch.setattr("controller.main.run", f)  # see nodeagent.config\n'
        "x = controller.main.run  # a variable called controller\n"
        'log = "controller.log"; name = "tether.controller.main"; a = "tether-controller.service"\n'
    )
    assert py(src) == (
        'monkeypatch.setattr("tether.controller.main.run", f)  # see tether.nodeagent.config\n'
        "x = controller.main.run  # a variable called controller\n"
        'log = "controller.log"; name = "tether.controller.main"; a = "tether-controller.service"\n'
    )


def test_fstring_fields_are_code_and_installed_paths_gain_the_package() -> None:
    src = 'p = f"{controller.main} nodeagent.main {lib}/controller/m lib/nodeagent/m"\n'
    want = 'p = f"{controller.main} tether.nodeagent.main {lib}/tether/controller/m lib/tether/nodeagent/m"\n'
    assert py(src) == want


def test_prose_past_the_line_limit_keeps_the_short_name() -> None:
    rules = one.Rules(set(MODULES), 35)
    out = one.rewrite_python("x = 1  # nodeagent.main says so\n", "x.py", rules)
    assert out == "x = 1  # nodeagent.main says so\n"
    assert rules.kept == ["x.py:1: short form kept (the line would pass 35): # nodeagent.main says so"]


def test_pyproject_discovery_mypy_and_isort() -> None:
    text = (
        '[project.scripts]\ntether-agent = "nodeagent.main:main"\n\n'
        '[tool.setuptools.packages.find]\nwhere = [".", "proto"]\ninclude = ["controller*", "tether*"]\n\n'
        '[tool.mypy]\npackages = ["controller", "nodeagent", "bench"]\nexclude = ["^proto/tether/"]\n\n'
        '[[tool.mypy.overrides]]\nmodule = ["tether.*"]\n\n'
        '[tool.ruff.lint.isort]\nknown-first-party = ["controller", "tether", "tests"]\n'
    )
    out = one.rewrite_pyproject(text, set(MODULES))
    assert 'tether-agent = "tether.nodeagent.main:main"' in out
    assert 'where = ["proto"]\ninclude = ["tether", "tether.*"]' in out
    assert 'packages = ["tether", "bench"]\nexclude = ["^proto/tether/v1/"]' in out
    assert 'module = ["tether.v1.*"]' in out and 'known-first-party = ["tether", "tests"]' in out
    assert one.rewrite_pyproject(out, set(MODULES)) == out


def small_tree(root: Path) -> None:
    files = {
        "controller/__init__.py": "",
        "controller/main.py": '"""Runs ``nodeagent.main``."""\n\nfrom nodeagent.main import run\n',
        "nodeagent/__init__.py": "",
        "nodeagent/main.py": "def run() -> None:\n    pass\n",
        "bootstrap/__init__.py": "",
        "proto/tether/__init__.py": "",
        "docs/x.md": "`python -m controller.main` writes controller.log\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    subprocess.run(["git", "init", "-q", str(root)], check=True)


def script(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(SCRIPT), "--root", str(root), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_a_tree_is_converted_once_and_then_checks_clean(tmp_path: Path) -> None:
    small_tree(tmp_path)
    assert script(tmp_path, "--check").returncode == 1
    assert script(tmp_path).returncode == 0
    assert os.readlink(tmp_path / "proto/tether/controller") == "../../controller"
    assert (tmp_path / "controller/main.py").read_text() == (
        '"""Runs ``tether.nodeagent.main``."""\n\nfrom tether.nodeagent.main import run\n'
    )
    doc = (tmp_path / "docs/x.md").read_text()
    assert doc == "`python -m tether.controller.main` writes controller.log\n"
    again = script(tmp_path)
    assert again.returncode == 0 and "0 file(s) rewritten" in again.stdout
    assert script(tmp_path, "--check").returncode == 0
    (tmp_path / "nodeagent/late.py").write_text("from controller import main\n")  # someone's new import
    late = script(tmp_path, "--check")
    assert late.returncode == 1 and "nodeagent/late.py:1: from controller import main" in late.stdout


def test_this_repository_has_one_top_level_package() -> None:
    out = script(ROOT, "--check")
    assert out.returncode == 0, out.stdout + out.stderr
