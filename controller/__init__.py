"""tether controller: holds environments, join tokens, plans, events and join material."""

__version__ = "0.1.0"
