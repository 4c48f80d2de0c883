"""Typed Environment spec (holodeck's ``holodeck.nvidia.com/v1alpha1`` layout)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

PHASES = ("pre-install", "post-runtime", "post-toolkit", "post-kubernetes", "post-install")


@dataclass(frozen=True)
class CustomTemplate:
    name: str
    phase: str = "post-install"
    inline: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    continue_on_error: bool = False
    timeout_seconds: int = 600


@dataclass(frozen=True)
class EnvironmentSpec:
    name: str
    custom_templates: tuple[CustomTemplate, ...] = ()
