"""Environment names: what each apiVersion accepts, and the DNS-safe form used where one is needed.

tether's own apiVersion keeps the DNS label rule (lowercase letters, digits and ``-``, at most
63 characters). holodeck never checked ``metadata.name``, and its own examples use names like
``aws_kubeadm_example`` and ``draKind``; under holodeck's apiVersion a name is letters, digits,
``.``, ``_`` and ``-``, starting with a letter or digit, at most 253 characters. That is narrower
than "anything printable" on purpose: the name is a store key, a token's scope, a URI in an admin
certificate (``spiffe://tether/admin-environment/NAME``) and a word in log lines, so it has no
whitespace, no path separator and nothing a URI, a shell or a file name would read specially.

The name as written stays the environment's key everywhere (store, tokens, admin scopes, the
CLI). Where a DNS label is needed (kubeadm's ``clusterName``, and so the kubeconfig's cluster and
context names) tether uses ``dns_name(name)``: lowercased, every other character replaced by
``-``, no ``-`` at either end, at most 63 characters (a longer name is cut and given a short hash
of the whole name so two long names stay apart). A DNS label is its own DNS-safe form. Two
environments whose names have the same DNS-safe form (``a_b`` and ``a-b``) cannot both exist.
"""

from __future__ import annotations

import hashlib
import re

DNS_LABEL_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
HOLODECK_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
DNS_LABEL_RULE = "lowercase letters, digits and '-', at most 63 characters"
HOLODECK_NAME_RULE = (
    "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 253 characters"
)


def is_environment_name(name: str) -> bool:
    """A name some apiVersion accepts (scopes and lookups take either kind)."""
    return bool(HOLODECK_NAME_RE.fullmatch(name))


def dns_name(name: str) -> str:
    """The DNS label for ``name`` (itself when it is one): ``aws_kubeadm_example`` ->
    ``aws-kubeadm-example``, ``draKind`` -> ``drakind``."""
    if DNS_LABEL_RE.fullmatch(name):
        return name
    label = re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-") or "env"
    if len(label) > 63:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        label = f"{label[:54].rstrip('-')}-{digest}"
    return label
