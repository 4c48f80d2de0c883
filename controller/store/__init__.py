"""The controller's state: one interface (``Store``), an embedded SQLite backend."""

from controller.store.base import Store
from controller.store.records import EnvironmentRecord, NodeRecord, StepRecord
from controller.store.sqlite import SqliteStore

__all__ = ["EnvironmentRecord", "NodeRecord", "SqliteStore", "StepRecord", "Store"]
