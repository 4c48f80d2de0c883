"""Parse an Environment document and validate it, collecting every problem with its field path."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from controller.errors import InvalidArgument
from controller.spec.model import PHASES, CustomTemplate, EnvironmentSpec

API_VERSIONS = ("holodeck.nvidia.com/v1alpha1", "tether.dev/v1alpha1")
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_TIMEOUT = 24 * 3600


class SpecError(InvalidArgument):
    """The document is invalid; ``problems`` holds one ``path: message`` line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(f"invalid environment ({len(problems)} problems)", problems)


@dataclass(frozen=True)
class LoadedSpec:
    spec: EnvironmentSpec
    api_version: str
    normalized: Mapping[str, Any]
    notes: tuple[str, ...] = field(default=())


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(f"{path}: {message}")


def load_document(text: str) -> LoadedSpec:
    problems = _Problems()
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError([f"document: not valid YAML: {exc}"]) from None
    if not isinstance(doc, dict):
        raise SpecError(["document: expected a mapping with apiVersion, kind, metadata and spec"])
    api_version = doc.get("apiVersion")
    if api_version not in API_VERSIONS:
        problems.add("apiVersion", f"must be one of {', '.join(API_VERSIONS)} (got {api_version!r})")
    if doc.get("kind") != "Environment":
        problems.add("kind", f"must be Environment (got {doc.get('kind')!r})")
    meta = doc.get("metadata") or {}
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not NAME_RE.match(name):
        problems.add("metadata.name", "required: lowercase letters, digits and '-', at most 63 characters")
    spec = doc.get("spec") or {}
    if not isinstance(spec, dict):
        problems.add("spec", "must be a mapping")
        spec = {}
    templates = _custom_templates(spec.get("customTemplates") or [], problems)
    if problems.items:
        raise SpecError(problems.items)
    model = EnvironmentSpec(name=str(name), custom_templates=tuple(templates))
    return LoadedSpec(spec=model, api_version=str(api_version), normalized=doc)


def _custom_templates(raw: Any, problems: _Problems) -> list[CustomTemplate]:
    if not isinstance(raw, list):
        problems.add("spec.customTemplates", "must be a list")
        return []
    out: list[CustomTemplate] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        path = f"spec.customTemplates[{i}]"
        if not isinstance(item, dict):
            problems.add(path, "must be a mapping")
            continue
        name = item.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            problems.add(f"{path}.name", "required: lowercase letters, digits and '-'")
            name = f"template-{i}"
        elif name in seen:
            problems.add(f"{path}.name", f"duplicate template name {name!r}")
        seen.add(name)
        phase = item.get("phase", "post-install")
        if phase not in PHASES:
            problems.add(f"{path}.phase", f"must be one of {', '.join(PHASES)}")
        inline = item.get("inline")
        if not isinstance(inline, str) or not inline.strip():
            problems.add(f"{path}.inline", "required: the script text")
            inline = ""
        env = item.get("env") or {}
        clean_env: dict[str, str] = {}
        if not isinstance(env, dict):
            problems.add(f"{path}.env", "must be a mapping of NAME: value")
        else:
            for k, v in env.items():
                if not isinstance(k, str) or not ENV_NAME_RE.match(k):
                    problems.add(f"{path}.env.{k}", "not a valid environment variable name")
                elif not isinstance(v, (str, int, float, bool)):
                    problems.add(f"{path}.env.{k}", "value must be a string")
                elif "\x00" in str(v):
                    problems.add(f"{path}.env.{k}", "value must not contain NUL")
                else:
                    clean_env[k] = str(v)
        timeout = item.get("timeout", 600)
        if isinstance(timeout, bool) or not isinstance(timeout, int) or not 1 <= timeout <= MAX_TIMEOUT:
            problems.add(f"{path}.timeout", f"must be whole seconds between 1 and {MAX_TIMEOUT}")
            timeout = 600
        coe = item.get("continueOnError", False)
        if not isinstance(coe, bool):
            problems.add(f"{path}.continueOnError", "must be true or false")
            coe = False
        out.append(
            CustomTemplate(
                name=name,
                phase=phase,
                inline=inline,
                env=clean_env,
                continue_on_error=coe,
                timeout_seconds=timeout,
            )
        )
    return out
