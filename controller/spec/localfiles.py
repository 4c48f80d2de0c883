"""Inline the operator's local files into a document before it leaves the operator's machine.

holodeck resolved ``file:`` paths against the CLI's working directory although its docs said
the config's directory (its examples say ``kindConfig: ./examples/kind.yaml``, run from the
repository's root). tether looks beside the YAML file first, then in the working directory, and
says in a note which one it read, here, in tetherctl, because the controller and the nodes
never see the operator's disk. In a stream of several YAML documents, the Environment's files
are inlined (``load.pick_environment``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from tether.controller.spec import bounded_yaml, checks
from tether.controller.spec.load import SpecError, pick_environment

MAX_FILE = 1 << 20
CONFIG_FIELDS = ("kubeAdmConfig", "kindConfig")


class _Where:
    """Where relative paths are looked for: beside the YAML file, then the working directory."""

    def __init__(self, base_dir: Path, cwd: Path, notes: list[str]) -> None:
        self.base_dir, self.cwd, self.notes = base_dir, cwd, notes

    def find(self, rel: str, path: str, problems: list[str]) -> Path | None:
        beside, here = self.base_dir / rel, self.cwd / rel
        if beside.is_file() or Path(rel).is_absolute():
            if Path(rel).is_absolute():
                where = ""
            elif self.base_dir.resolve() == self.cwd.resolve():
                where = " (in the working directory)"
            else:
                where = " (beside the YAML file)"
            self.notes.append(f"{path}: read {beside}{where}")
            return beside
        if here.is_file() and here.resolve() != beside.resolve():
            self.notes.append(f"{path}: read {here} (from the working directory: not beside the YAML file)")
            return here
        if here.resolve() == beside.resolve():
            problems.append(f"{path}: cannot read {beside}: no such file")
        else:
            problems.append(
                f"{path}: cannot read {rel}: neither beside the YAML file ({beside}) nor in the working "
                f"directory ({here})"
            )
        return None


def _read(where: _Where, rel: str, path: str, problems: list[str]) -> str | None:
    reason = checks.check_local_path(rel)
    if reason:
        problems.append(f"{path}: {reason}")
        return None
    target = where.find(rel, path, problems)
    if target is None:
        return None
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


def _inline_templates(spec: dict[Any, Any], where: _Where, problems: list[str]) -> bool:
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
        text = _read(where, item[fkey], path, problems)
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


def _inline_configs(spec: dict[Any, Any], where: _Where, problems: list[str]) -> bool:
    changed = False
    kkey = _key(spec, "kubernetes")
    k8s = spec.get(kkey) if kkey is not None else None
    if not isinstance(k8s, dict):
        return False
    for name in CONFIG_FIELDS:
        key = _key(k8s, name)
        if key is None or not isinstance(k8s[key], str) or not k8s[key]:
            continue
        text = _read(where, k8s[key], f"spec.kubernetes.{key}", problems)
        if text is None:
            continue
        del k8s[key]
        k8s[f"{name}Content"] = text
        changed = True
    return changed


def inline_local_files(
    text: str, base_dir: Path | str, *, cwd: Path | str | None = None, notes: list[str] | None = None
) -> str:
    """``text`` with every ``customTemplates[].file``, ``kubeAdmConfig`` and ``kindConfig`` path
    replaced by the file's content: relative paths are looked for beside the YAML file
    (``base_dir``), then in the working directory (``cwd``, default the process's); ``notes``
    gets one ``path: read FILE (where)`` line per file. Unchanged text when there is none;
    ``SpecError`` listing every file that cannot be read or does not match its checksum."""
    try:
        docs = bounded_yaml.load_all(text)
        doc, _ = pick_environment(docs)
    except (yaml.YAMLError, SpecError):
        return text  # load_document reports it
    spec = doc.get("spec") if isinstance(doc, dict) else None
    if not isinstance(spec, dict):
        return text
    problems: list[str] = []
    where = _Where(Path(base_dir), Path.cwd() if cwd is None else Path(cwd), [])
    changed = _inline_templates(spec, where, problems)
    changed = _inline_configs(spec, where, problems) or changed
    if problems:
        raise SpecError(problems)
    if notes is not None:
        notes.extend(where.notes)
    if not changed:
        return text
    if len(docs) == 1:
        return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    return yaml.safe_dump_all(docs, sort_keys=False, allow_unicode=True)
