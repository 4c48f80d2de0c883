"""The controller's state: one interface (``Store``), an embedded SQLite backend."""

from tether.controller.store.base import Store
from tether.controller.store.records import EnvironmentRecord, NodeRecord, StepRecord
from tether.controller.store.sqlite import SqliteStore

__all__ = ["EnvironmentRecord", "NodeRecord", "SqliteStore", "StepRecord", "Store"]
