"""The admin kubeconfig an init node sends, made safe to hand to operators.

``tetherctl cluster kubeconfig`` gives operators what the init node sent, so a node must not be
able to make their kubectl run a program (``exec``, ``auth-provider``), read files on their
machine (``tokenFile`` and the file forms of certificates), send their traffic elsewhere
(``proxy-url``) or skip server verification (``insecure-skip-tls-verify``). Those settings are
stripped (not refused: kubeadm's admin.conf has none, so stripping changes nothing legitimate);
what is stripped is named (never its value) so it can be logged. A document that is not a
kubeconfig is refused.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import yaml

from tether.controller.spec import bounded_yaml

# Per section of a kubeconfig: the keys that are removed wherever they appear.
UNSAFE_USER_KEYS = frozenset(
    {
        "exec",
        "auth-provider",
        "tokenFile",
        "username",
        "password",
        "client-certificate",
        "client-key",
        "as",
        "as-uid",
        "as-groups",
        "as-user-extra",
    }
)
UNSAFE_CLUSTER_KEYS = frozenset({"insecure-skip-tls-verify", "certificate-authority", "proxy-url"})
SECTIONS = (("users", "user", UNSAFE_USER_KEYS), ("clusters", "cluster", UNSAFE_CLUSTER_KEYS))


class KubeconfigRefused(ValueError):
    """Not a kubeconfig (the message never shows its content)."""


def _strip(entries: Any, inner: str, unsafe: frozenset[str], removed: list[str]) -> None:
    if not isinstance(entries, list):
        raise KubeconfigRefused(f"the kubeconfig's {inner}s are not a list")
    for entry in entries:
        body = entry.get(inner) if isinstance(entry, dict) else None
        if not isinstance(body, dict):
            raise KubeconfigRefused(f"a kubeconfig {inner} entry has no {inner} mapping")
        for key in sorted(unsafe & set(body)):
            del body[key]
            removed.append(f"{inner}.{key}")


def sanitise(b64: str) -> tuple[str, list[str]]:
    """(the kubeconfig without unsafe settings, base64 like the input; the settings removed)."""
    try:
        doc = bounded_yaml.load(base64.b64decode(b64, validate=True).decode())
    except (binascii.Error, ValueError, yaml.YAMLError):  # bounded: depth, size, aliases
        raise KubeconfigRefused("the kubeconfig is not base64-encoded YAML") from None
    if not isinstance(doc, dict) or doc.get("kind", "Config") != "Config":
        raise KubeconfigRefused("the document is not a kubeconfig (kind: Config)")
    removed: list[str] = []
    for outer, inner, unsafe in SECTIONS:
        _strip(doc.get(outer) or [], inner, unsafe, removed)
    doc.pop("preferences", None)
    text = yaml.safe_dump(doc, sort_keys=False)
    return base64.b64encode(text.encode()).decode(), removed
