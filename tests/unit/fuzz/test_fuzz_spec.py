"""Fuzz the spec loader: whatever the text, ``load_document`` returns or raises ``SpecError``.

Three sources of text: characters YAML gives meaning to, shuffled; random structures dumped to
YAML; and a real document with parts of it replaced by random values (so the parsers deep in
the spec see wrong types and odd strings, not just a refused top level). ``inline_local_files``
(tetherctl's first look at the same text) may raise only ``SpecError`` too.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.fuzz.pbgen import FUZZ
from tether.controller.spec import SpecError, inline_local_files, load_document

BASE: dict[str, Any] = {
    "apiVersion": "holodeck.nvidia.com/v1alpha1",
    "kind": "Environment",
    "metadata": {"name": "fuzz"},
    "spec": {
        "kernel": {"version": "6.8.0-1015-aws"},
        "nvidiaDriver": {"install": True, "package": {"branch": "570", "version": "570.1"}},
        "containerRuntime": {"install": True, "name": "containerd", "version": "1.7.27"},
        "nvidiaContainerToolkit": {"install": True, "enableCDI": True},
        "kubernetes": {
            "install": True,
            "installer": "kubeadm",
            "version": "v1.31.1",
            "K8sFeatureGates": ["DynamicResourceAllocation=true"],
            "K8sEndpointHost": "api.example.com",
        },
        "cluster": {
            "controlPlane": {"count": 3, "labels": {"team": "a"}},
            "workers": {"count": 2},
            "highAvailability": {"enabled": True, "endpoint": "lb.example.com:6443"},
        },
        "customTemplates": [{"name": "t", "phase": "post-install", "inline": "true", "env": {"A": "b"}}],
        "packageRepositories": {"apt": [{"url": "https://a.com/d", "suite": "stable", "trusted": True}]},
        "downloadMirror": "https://mirror.example.com",
    },
}

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(["", "v1.31.1", "570", "x\n", "$(id)", "https://e.com/a", "2001-13-45", "1e999"])
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(scalars, inner, max_size=3),
    max_leaves=10,
)
YAMLISH = "[]{}:,-&*!|>'\"#?%@`<= \n\tabcvx019.~"


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw: Any) -> str:
    doc = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(_paths(doc)[1:]))
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        parent[path[-1]] = draw(values)
    return yaml.safe_dump(doc, allow_unicode=draw(st.booleans()))


texts = (
    st.text(alphabet=YAMLISH, max_size=120)
    | values.map(lambda v: yaml.safe_dump(v))
    | mutated()
    | st.text(max_size=80)
)


def _loads_or_refuses(text: str) -> None:
    problems: list[str] = []
    try:
        load_document(text)
    except SpecError as exc:
        problems = exc.problems or [""]
    assert all(p and isinstance(p, str) for p in problems)


@FUZZ
@given(texts)
def test_load_document_raises_only_spec_error(text: str) -> None:
    _loads_or_refuses(text)


@FUZZ
@given(texts)
def test_inline_local_files_raises_only_spec_error(text: str) -> None:
    try:
        inlined = inline_local_files(text, Path("/nonexistent-fuzz-dir"))
    except SpecError:
        return
    _loads_or_refuses(inlined)
