"""The Environment spec: model, loading and validation (every problem at once, with its path).

Modules: ``model`` (typed spec), ``load`` (``load_document``, ``SpecError``, ``LoadedSpec``),
``reader`` (path-tracking field access), ``checks`` (validators for shell-bound values),
``parse_*`` (one reader per spec section), ``defaults``, ``localfiles`` (tetherctl's inlining).
"""

from tether.controller.spec.load import API_VERSIONS, LoadedSpec, SpecError, load_document
from tether.controller.spec.localfiles import inline_local_files
from tether.controller.spec.model import (
    ClusterSpec,
    CustomTemplate,
    DriverSpec,
    EnvironmentSpec,
    GitSource,
    KernelSpec,
    KubernetesSpec,
    PackageRepositories,
    PackageRepository,
    RuntimeSpec,
    ToolkitSpec,
)

__all__ = [
    "API_VERSIONS",
    "ClusterSpec",
    "CustomTemplate",
    "DriverSpec",
    "EnvironmentSpec",
    "GitSource",
    "KernelSpec",
    "KubernetesSpec",
    "LoadedSpec",
    "PackageRepositories",
    "PackageRepository",
    "RuntimeSpec",
    "SpecError",
    "ToolkitSpec",
    "inline_local_files",
    "load_document",
]
