"""Deep nesting and alias bombs are refused with one line, before anything walks them (issue 10, item 8).

A 200k-deep document used to raise ``RecursionError`` out of ``yaml.safe_load`` (an INTERNAL
error with a traceback at the controller, a crash in ``tetherctl env validate``); a "billion
laughs" document is small to parse but explodes for whoever walks it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tether.controller.limits import MAX_YAML_DEPTH, MAX_YAML_NODES
from tether.controller.spec import SpecError, bounded_yaml, inline_local_files, load_document

HEAD = "apiVersion: tether.dev/v1alpha1\nkind: Environment\nmetadata: {name: env}\n"


def _one_problem(text: str) -> str:
    with pytest.raises(SpecError) as err:
        load_document(text)
    assert len(err.value.problems) == 1
    (line,) = err.value.problems
    assert "\n" not in line
    return line


def _laughs(levels: int = 9) -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return HEAD + "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "text",
    [
        "[" * 200_000 + "]" * 200_000,
        "a: {" * 200_000 + "}" * 200_000,
        HEAD + "spec: " + "[" * 200_000 + "]" * 200_000,
    ],
    ids=["lists", "mappings", "under-spec"],
)
def test_a_200k_deep_document_is_one_line_naming_the_depth_limit(text: str) -> None:
    line = _one_problem(text)
    assert line == f"document: nested deeper than {MAX_YAML_DEPTH} levels (the limit)"


def test_the_depth_limit_is_exact() -> None:
    # The document mapping is level 1, so spec's value may nest MAX_YAML_DEPTH - 1 levels.
    ok = MAX_YAML_DEPTH - 1
    fits = HEAD + "spec: {x: " + "[" * (ok - 1) + "]" * (ok - 1) + "}\n"
    assert "spec.x: unknown field" in _one_problem(fits)
    over = HEAD + "spec: {x: " + "[" * ok + "]" * ok + "}\n"
    assert "nested deeper than" in _one_problem(over)


def test_billion_laughs_is_refused_by_the_node_limit() -> None:
    line = _one_problem(_laughs())
    assert line == f"document: more than {MAX_YAML_NODES} nodes, aliases expanded (the limit)"


def test_an_alias_inside_the_node_it_names_is_refused() -> None:
    line = _one_problem(HEAD + "spec: &s {kernel: *s}\n")
    assert "inside the node it names" in line


@pytest.mark.parametrize(
    "stream",
    [
        "a: &a x\n---\nb: &a [*a]\n",  # an anchor of document 1 named again in document 2
        HEAD + "x: &s 1\n---\n" + HEAD + "futureField: &s {y: *s}\n",  # a loop in the Environment
        "a: &s 1\n---\n" + HEAD + "spec: {x: &s {y: *s}}\n",
    ],
    ids=["second-document", "environment", "environment-spec"],
)
def test_an_alias_inside_the_node_it_names_is_refused_in_any_document_of_a_stream(stream: str) -> None:
    # PyYAML starts anchors afresh in every document: an anchor finished in an earlier document
    # says nothing about the size of one of the same name still open in this one.
    with pytest.raises(bounded_yaml.YamlLimit, match="inside the node it names"):
        bounded_yaml.load_all(stream)
    assert "inside the node it names" in _one_problem(stream)


def test_an_anchor_of_an_earlier_document_is_not_known_in_the_next() -> None:
    with pytest.raises(yaml.YAMLError, match="undefined alias"):
        bounded_yaml.load_all("a: &a x\n---\nb: *a\n")
    assert bounded_yaml.load_all("a: &a x\n---\nb: &a [1]\nc: *a\n") == [{"a": "x"}, {"b": [1], "c": [1]}]


def test_a_few_aliases_still_load() -> None:
    text = HEAD + "x: &v {version: 6.8.0-1015-aws}\nspec:\n  kernel: *v\n"
    problems = _one_problem(text)  # only the unknown top-level anchor holder, not a limit
    assert problems == "x: unknown field"
    assert load_document(HEAD + "spec:\n  kernel: &v {version: 6.8.0-1015-aws}\n").spec.kernel.version


@pytest.mark.parametrize("text", ["a: 2001-13-45\n", "a: " + "1" * 5000 + "\n", "a: !!float x\n"])
def test_a_scalar_the_constructor_cannot_build_is_a_problem_not_a_crash(text: str) -> None:
    assert _one_problem(HEAD + text).startswith("document: not valid YAML: a value cannot be read")


def test_inline_local_files_leaves_a_deep_document_to_load_document(tmp_path: Path) -> None:
    deep = "[" * 200_000 + "]" * 200_000
    assert inline_local_files(deep, tmp_path) == deep
    assert inline_local_files(_laughs(), tmp_path) == _laughs()
