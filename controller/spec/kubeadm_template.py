"""holodeck's Go-templated ``kubeAdmConfig``: its four placeholders, and nothing else.

holodeck executes the user's kubeadm config as a Go template with ``.CriSocket``,
``.ClusterName``, ``.KubernetesVersion`` and ``.ControlPlaneEndpoint`` (a host, no port: its
example writes ``"{{ .ControlPlaneEndpoint }}:6443"``). tether executes no template: it replaces
exactly those four placeholders (``{{ .Name }}``, any spaces inside the braces) when it renders
the node's plan, and refuses any other ``{{ ... }}`` action (conditionals, pipelines, other
fields, trim markers) with its line, when the spec is loaded. ``{{ .ControlPlaneEndpoint }}:6443``
as a whole becomes the endpoint tether uses, port included (``expand``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

PLACEHOLDERS = ("CriSocket", "ClusterName", "KubernetesVersion", "ControlPlaneEndpoint")
PLACEHOLDER_RE = re.compile(r"\{\{[ \t]*\.(" + "|".join(PLACEHOLDERS) + r")[ \t]*\}\}")
ENDPOINT_WITH_PORT_RE = re.compile(r"\{\{[ \t]*\.ControlPlaneEndpoint[ \t]*\}\}:6443(?![0-9])")
ACTION_RE = re.compile(r"\{\{.{0,60}?(\}\}|$)", re.MULTILINE)


def check(text: str) -> str:
    """``""`` when every ``{{`` in ``text`` opens one of the four placeholders, else the reason
    (naming the first other action and its line)."""
    rest = PLACEHOLDER_RE.sub("", text)
    at = rest.find("{{")
    if at < 0:
        return ""
    m = ACTION_RE.match(rest, at)
    action = m.group(0) if m else rest[at : at + 60]
    line = text.count("\n", 0, _original_offset(text, at)) + 1
    names = ", ".join(f"{{{{ .{p} }}}}" for p in PLACEHOLDERS)
    return f"line {line}: {action!r} is a Go-template action tether does not run; only {names} are filled in"


def _original_offset(text: str, offset_in_rest: int) -> int:
    """The offset in ``text`` of ``offset_in_rest`` in ``text`` with the placeholders removed."""
    removed = 0
    for m in PLACEHOLDER_RE.finditer(text):
        if m.start() - removed > offset_in_rest:
            break
        removed += m.end() - m.start()
    return offset_in_rest + removed


def uses(text: str, name: str) -> bool:
    return any(m.group(1) == name for m in PLACEHOLDER_RE.finditer(text))


def expand(text: str, values: Mapping[str, str], *, endpoint: str = "") -> str:
    """``text`` with each of the four placeholders replaced by its value (all four required).

    ``endpoint`` (host:port): holodeck's files write ``{{ .ControlPlaneEndpoint }}:6443`` (its
    API port); with ``endpoint`` given, that whole ``host:6443`` becomes ``endpoint``, so an
    endpoint on another port (a load balancer's, tether's local one) keeps its port."""
    if endpoint:
        text = ENDPOINT_WITH_PORT_RE.sub(lambda _: endpoint, text)
    return PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], text)
