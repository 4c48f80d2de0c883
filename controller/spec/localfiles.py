"""Inline the operator's local files into a document before it leaves the operator's machine.

holodeck resolved ``file:`` paths against the CLI's working directory although its docs said
the config's directory; tether resolves them against the YAML file's directory, here, in
tetherctl, because the controller and the nodes never see the operator's disk.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from tether.controller.spec import bounded_yaml, checks
from tether.controller.spec.load import SpecError

MAX_FILE = 1 << 20
CONFIG_FIELDS = ("kubeAdmConfig", "kindConfig")


def _read(base_dir: Path, rel: str, path: str, problems: list[str]) -> str | None:
    reason = checks.check_local_path(rel)
    if reason:
        problems.append(f"{path}: {reason}")
        return None
    target = base_dir / rel
    try:
        data = target.read_bytes()
    except OSError as exc:
        problems.append(f"{path}: cannot read {target}: {exc.strerror}")
        return None
    if len(data) > MAX_FILE:
        problems.append(f"{path}: {target} is larger than {MAX_FILE} bytes")
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        problems.append(f"{path}: {target} is not UTF-8 text")
        return None


def _key(mapping: dict[Any, Any], name: str) -> Any:
    for key in mapping:
        if str(key).lower() == name.lower():
            return key
    return None


def _inline_templates(spec: dict[Any, Any], base_dir: Path, problems: list[str]) -> bool:
    changed = False
    key = _key(spec, "customTemplates")
    templates = spec.get(key) if key is not None else None
    if not isinstance(templates, list):
        return False
    for i, item in enumerate(templates):
        fkey = _key(item, "file") if isinstance(item, dict) else None
        if fkey is None or not isinstance(item[fkey], str):
            continue
        path = f"spec.customTemplates[{i}].{fkey}"
        text = _read(base_dir, item[fkey], path, problems)
        if text is None:
            continue
        ckey = _key(item, "checksum")
        want = checks.normalize_sha256(str(item[ckey])) if ckey is not None else None
        if want and hashlib.sha256(text.encode()).hexdigest() != want:
            problems.append(f"spec.customTemplates[{i}].checksum: does not match {item[fkey]}")
            continue
        del item[fkey]
        item["inline"] = text
        changed = True
    return changed


def _inline_configs(spec: dict[Any, Any], base_dir: Path, problems: list[str]) -> bool:
    changed = False
    kkey = _key(spec, "kubernetes")
    k8s = spec.get(kkey) if kkey is not None else None
    if not isinstance(k8s, dict):
        return False
    for name in CONFIG_FIELDS:
        key = _key(k8s, name)
        if key is None or not isinstance(k8s[key], str) or not k8s[key]:
            continue
        text = _read(base_dir, k8s[key], f"spec.kubernetes.{key}", problems)
        if text is None:
            continue
        del k8s[key]
        k8s[f"{name}Content"] = text
        changed = True
    return changed


def inline_local_files(text: str, base_dir: Path | str) -> str:
    """``text`` with every ``customTemplates[].file``, ``kubeAdmConfig`` and ``kindConfig`` path
    (relative to ``base_dir``) replaced by the file's content. Unchanged text when there is none;
    ``SpecError`` listing every file that cannot be read or does not match its checksum."""
    try:
        doc = bounded_yaml.load(text)
    except yaml.YAMLError:
        return text  # load_document reports it
    spec = doc.get("spec") if isinstance(doc, dict) else None
    if not isinstance(spec, dict):
        return text
    problems: list[str] = []
    base = Path(base_dir)
    changed = _inline_templates(spec, base, problems)
    changed = _inline_configs(spec, base, problems) or changed
    if problems:
        raise SpecError(problems)
    if not changed:
        return text
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
