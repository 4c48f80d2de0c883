"""Helpers of the API hygiene tests: the scripts as modules, and a copy of the protos to edit."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = ROOT / "proto"
PACKAGE_DIR = Path("tether") / "v1"


def load_script(name: str) -> ModuleType:
    """scripts/<name>.py, imported under its own name."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def copy_protos(dest: Path) -> Path:
    """The .proto files and buf.yaml under ``dest`` (a proto root of its own); returns it."""
    (dest / PACKAGE_DIR).mkdir(parents=True)
    for proto in (PROTO_ROOT / PACKAGE_DIR).glob("*.proto"):
        shutil.copyfile(proto, dest / PACKAGE_DIR / proto.name)
    shutil.copyfile(PROTO_ROOT / "buf.yaml", dest / "buf.yaml")
    return dest


def edit(root: Path, name: str, old: str, new: str) -> None:
    """Replace the one occurrence of ``old`` in tether/v1/<name> under ``root``."""
    path = root / PACKAGE_DIR / name
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {name}"
    path.write_text(text.replace(old, new))
