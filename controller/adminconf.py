"""``admin.conf``: everything tetherctl needs to reach the controller (address, CA, client cert).

Written by the controller on first start (mode 0600: it holds a private key);
the address is refreshed on every start so ``--listen HOST:0`` keeps working.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from controller.errors import InvalidArgument
from nodeagent.identity import read_private, write_private

KIND = "AdminConfig"


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (PEM blocks) as readable literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)
API_VERSION = "tether.dev/v1alpha1"


@dataclass(frozen=True)
class AdminConfig:
    controller: str
    ca_hash: str
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    name: str = "admin"
    role: str = "admin"

    def __repr__(self) -> str:
        return f"AdminConfig(controller={self.controller!r}, name={self.name!r}, role={self.role!r})"

    def dump(self) -> bytes:
        doc = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "controller": self.controller,
            "caHash": self.ca_hash,
            "name": self.name,
            "role": self.role,
            "ca": self.ca_pem.decode(),
            "certificate": self.cert_pem.decode(),
            "key": self.key_pem.decode(),
        }
        header = (
            "# tether admin client configuration (tetherctl --config).\n"
            "# It holds a private key: keep it 0600.\n"
        )
        return (header + yaml.dump(doc, Dumper=_BlockDumper, sort_keys=False)).encode()

    def write(self, path: Path) -> None:
        write_private(path, self.dump())

    @staticmethod
    def read(path: Path) -> AdminConfig:
        try:
            raw = read_private(path)
        except FileNotFoundError:
            raise InvalidArgument(f"admin config {path} does not exist") from None
        except Exception as exc:
            raise InvalidArgument(f"admin config {path}: {exc}") from None
        try:
            doc = yaml.safe_load(raw)
            return AdminConfig(
                controller=str(doc["controller"]),
                ca_hash=str(doc.get("caHash", "")),
                ca_pem=str(doc["ca"]).encode(),
                cert_pem=str(doc["certificate"]).encode(),
                key_pem=str(doc["key"]).encode(),
                name=str(doc.get("name", "admin")),
                role=str(doc.get("role", "admin")),
            )
        except (yaml.YAMLError, KeyError, TypeError) as exc:
            raise InvalidArgument(f"admin config {path} is not valid: {exc}") from None
