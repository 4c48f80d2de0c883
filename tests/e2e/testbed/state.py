"""The testbed's state directory: ``state.json`` records every resource as it is created.

``down`` works from this record alone (plus the slot registry), so it can clean up after an ``up`` that
crashed or was killed at any point. Writes are atomic (temp file + rename).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"


class State:
    """A dict persisted as ``DIR/state.json``; ``save()`` after every change."""

    def __init__(self, directory: Path, data: dict[str, Any] | None = None) -> None:
        self.dir = directory.resolve()
        self.data: dict[str, Any] = data if data is not None else {"version": 1, "nodes": {}, "procs": {}}

    @classmethod
    def create(cls, directory: Path) -> State:
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o755)  # nodes bind-mount files from here
        if (directory / STATE_FILE).exists():
            raise FileExistsError(
                f"{directory} already holds a testbed; run `down --state {directory}` first"
            )
        state = cls(directory)
        state.save()
        return state

    @classmethod
    def load(cls, directory: Path) -> State:
        return cls(directory, json.loads((directory / STATE_FILE).read_text()))

    @classmethod
    def exists(cls, directory: Path) -> bool:
        return (directory / STATE_FILE).exists()

    def save(self) -> None:
        tmp = self.dir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(self.data, indent=2, sort_keys=True))
        tmp.replace(self.dir / STATE_FILE)

    def remove(self) -> None:
        (self.dir / STATE_FILE).unlink(missing_ok=True)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.save()

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    @property
    def nodes(self) -> dict[str, dict[str, Any]]:
        nodes: dict[str, dict[str, Any]] = self.data["nodes"]
        return nodes
