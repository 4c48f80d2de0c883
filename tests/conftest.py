"""Every tier: the repository's folders are importable only as ``tether.*``.

pytest puts the repository root on ``sys.path``, which would let a stray ``import bootstrap`` or
``resources.files("nodeagent")`` find the folder under its old top-level name and pass here while
the installed package (which has only ``tether``) fails. This finder refuses those names.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

OLD_NAMES = frozenset({"controller", "nodeagent", "bootstrap"})


class _OnlyTether:
    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name.split(".")[0] in OLD_NAMES:
            raise ModuleNotFoundError(f"No module named {name!r} (use tether.{name})", name=name)
        return None


sys.meta_path.insert(0, _OnlyTether())
