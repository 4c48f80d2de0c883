"""``admin.conf``: everything tetherctl needs to reach a controller (address, CA, client cert).

Written by the controller on first start (mode 0600: it holds a private key);
the address is refreshed on every start so ``--listen HOST:0`` keeps working.

One file may also hold several controllers, kubectl-style: a ``contexts:`` list (each entry a
``name`` plus the fields of a single-controller file, the admin's own name as ``user``) and a
``current-context:``; ``--context`` / ``TETHER_CONTEXT`` picks another one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from tether.controller.errors import InvalidArgument
from tether.nodeagent.identity import read_private, write_private

KIND = "AdminConfig"
API_VERSION = "tether.dev/v1alpha1"
HEADER = (
    "# tether admin client configuration (tetherctl --config).\n# It holds a private key: keep it 0600.\n"
)


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (PEM blocks) as readable literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


@dataclass(frozen=True)
class AdminConfig:
    controller: str
    ca_hash: str
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    name: str = "admin"
    role: str = "admin"
    context: str = ""  # the context it came from ("" for a single-controller file)

    def __repr__(self) -> str:
        return f"AdminConfig(controller={self.controller!r}, name={self.name!r}, role={self.role!r})"

    def fields(self) -> dict[str, str]:
        return {
            "controller": self.controller,
            "caHash": self.ca_hash,
            "role": self.role,
            "ca": self.ca_pem.decode(),
            "certificate": self.cert_pem.decode(),
            "key": self.key_pem.decode(),
        }

    def dump(self) -> bytes:
        f = self.fields()
        head = {"apiVersion": API_VERSION, "kind": KIND, "controller": f.pop("controller")}
        return _dump({**head, "caHash": f.pop("caHash"), "name": self.name, **f})

    def write(self, path: Path) -> None:
        write_private(path, self.dump())

    @staticmethod
    def read(path: Path, context: str = "") -> AdminConfig:
        """The single controller of ``path``, or its context ``context`` (default: current-context)."""
        doc = _load(path)
        if "contexts" not in doc:
            if context:
                raise InvalidArgument(f"admin config {path} has no contexts (asked for context {context!r})")
            return _from_fields(doc, path, "")
        contexts = Contexts.parse(doc, path)
        return contexts.get(context or contexts.current, path)


@dataclass(frozen=True)
class Contexts:
    """The controllers of one admin config file, by context name, and the current one."""

    entries: tuple[AdminConfig, ...]
    current: str = ""

    @staticmethod
    def read(path: Path) -> Contexts:
        """Every context of ``path``; a single-controller file is one context named ``default``."""
        doc = _load(path)
        if "contexts" not in doc:
            return Contexts((replace(_from_fields(doc, path, ""), context="default"),), "default")
        return Contexts.parse(doc, path)

    @staticmethod
    def parse(doc: Mapping[str, Any], path: Path) -> Contexts:
        items = doc.get("contexts")
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise InvalidArgument(f"admin config {path}: contexts must be a list of mappings")
        entries = []
        for item in items:
            name = str(item.get("name", ""))
            if not name:
                raise InvalidArgument(f"admin config {path}: every context needs a name")
            entries.append(_from_fields(item, path, name))
        names = [e.context for e in entries]
        if len(set(names)) != len(names):
            raise InvalidArgument(f"admin config {path}: context names repeat")
        return Contexts(tuple(entries), str(doc.get("current-context") or ""))

    def names(self) -> list[str]:
        return [e.context for e in self.entries]

    def get(self, name: str, path: Path) -> AdminConfig:
        if not name:
            raise InvalidArgument(
                f"admin config {path} has no current-context: pick one with --context or TETHER_CONTEXT "
                f"({', '.join(self.names())})"
            )
        for e in self.entries:
            if e.context == name:
                return e
        raise InvalidArgument(
            f"admin config {path} has no context {name!r} (it has: {', '.join(self.names()) or 'none'})"
        )

    def with_context(self, conf: AdminConfig, name: str) -> Contexts:
        """These contexts with ``conf`` added (or replacing the one of the same name)."""
        entry = replace(conf, context=name)
        kept = tuple(e for e in self.entries if e.context != name)
        return Contexts((*kept, entry), self.current or name)

    def use(self, name: str, path: Path) -> Contexts:
        self.get(name, path)
        return Contexts(self.entries, name)

    def dump(self) -> bytes:
        contexts = [{"name": e.context, "user": e.name, **e.fields()} for e in self.entries]
        doc = {"apiVersion": API_VERSION, "kind": KIND, "current-context": self.current, "contexts": contexts}
        return _dump(doc)

    def write(self, path: Path) -> None:
        write_private(path, self.dump())


def _dump(doc: Mapping[str, Any]) -> bytes:
    return (HEADER + yaml.dump(dict(doc), Dumper=_BlockDumper, sort_keys=False)).encode()


def _load(path: Path) -> dict[str, Any]:
    try:
        raw = read_private(path)
    except FileNotFoundError:
        raise InvalidArgument(f"admin config {path} does not exist") from None
    except Exception as exc:
        raise InvalidArgument(f"admin config {path}: {exc}") from None
    try:
        doc = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise InvalidArgument(f"admin config {path} is not valid: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"admin config {path} is not valid: not a mapping")
    return doc


def _from_fields(doc: Mapping[str, Any], path: Path, context: str) -> AdminConfig:
    where = f"admin config {path}" + (f", context {context!r}," if context else "")
    try:
        return AdminConfig(
            controller=str(doc["controller"]),
            ca_hash=str(doc.get("caHash", "")),
            ca_pem=str(doc["ca"]).encode(),
            cert_pem=str(doc["certificate"]).encode(),
            key_pem=str(doc["key"]).encode(),
            name=str(doc.get("user" if context else "name", "admin")),
            role=str(doc.get("role", "admin")),
            context=context,
        )
    except (KeyError, TypeError) as exc:
        raise InvalidArgument(f"{where} is not valid: missing {exc}") from None
