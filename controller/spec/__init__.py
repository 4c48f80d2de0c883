"""The Environment spec: model, loading and validation (every problem at once, with its path)."""

from controller.spec.load import LoadedSpec, SpecError, load_document
from controller.spec.model import CustomTemplate, EnvironmentSpec

__all__ = ["CustomTemplate", "EnvironmentSpec", "LoadedSpec", "SpecError", "load_document"]
