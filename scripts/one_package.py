#!/usr/bin/env python3
"""Convert this tree so that the distribution installs one top-level import package, ``tether``.

The repository keeps its folders (controller/, nodeagent/, bootstrap/, proto/). The package
``tether`` is proto/tether (where the generated ``tether.v1`` already lives), and three committed
relative symlinks make the folders its subpackages::

    proto/tether/controller -> ../../controller      tether.controller
    proto/tether/nodeagent  -> ../../nodeagent       tether.nodeagent
    proto/tether/bootstrap  -> ../../bootstrap       tether.bootstrap

setuptools finds the packages under proto/ (following the links: the wheel holds real files under
``tether/`` only), the editable install maps ``tether`` to proto/tether, and mypy finds the same
files through ``mypy_path = "proto"``; ``PYTHONPATH=proto`` works without any install.

What it rewrites, by rules over every file git knows (tracked or new, not ignored; proto/ and this
script excepted), never by a list of files:

- import statements: ``from controller.x import y`` -> ``from tether.controller.x import y``,
  ``import nodeagent`` -> ``from tether import nodeagent`` (also in code held in strings, in docs);
- dotted module references in strings, comments and text (``"controller.planner.load_document"``,
  ``-m nodeagent.main``, entry points, ``bootstrap.bundle`` in docs): only when the name after the
  root is a real module or subpackage of that folder (``controller.log`` or a variable's
  ``controller.config`` in code is left alone; in Python only strings and comments are touched);
- installed paths: ``lib/nodeagent/...`` -> ``lib/tether/nodeagent/...`` (bundles, site dirs);
- ``sys.path.insert(0, str(<repo root>))`` gets ``/ "proto"`` added beside it;
- pyproject.toml: package discovery, mypy packages/exclude/overrides, isort's first-party list;
- a few structural edits that no rule can make (the bundle's source list, the install's depth in
  nodeagent/upgrade.py, the upgrade tests' source copy), each applied once and reported when the
  code around it has changed so that it needs a hand.

Then ``ruff check --select I --fix`` and ``ruff format`` on the Python files it changed (import
order moves: ``tests`` now sorts before ``tether``). Re-running changes nothing.

    python scripts/one_package.py            # convert
    python scripts/one_package.py --check    # exit 1 if anything old-style remains (lists it)
"""

from __future__ import annotations

import argparse
import difflib
import io
import os
import re
import shutil
import subprocess
import sys
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "tether"
ROOTS = ("controller", "nodeagent", "bootstrap")
PACKAGE_DIR = Path("proto") / PACKAGE
SKIP_PREFIXES = ("proto/", "scripts/one_package.py", "tests/unit/test_one_package.py", ".git/")
ROOTS_RE = "|".join(ROOTS)

FROM_RE = re.compile(rf"^([ \t]*)from[ \t]+({ROOTS_RE})((?:\.\w+)*)[ \t]+import\b", re.M)
IMPORT_RE = re.compile(
    rf"^([ \t]*)import[ \t]+({ROOTS_RE})((?:\.\w+)*)(?:[ \t]+as[ \t]+(\w+))?(?=[ \t]*(?:#.*)?$)", re.M
)
DOTTED_RE = re.compile(rf"(?<![\w.\-/$@])({ROOTS_RE})((?:\.[A-Za-z_]\w*)+)")
PATH_RE = re.compile(rf"(\blib/|\{{\w*lib\}}/|site-packages/)({ROOTS_RE})(?=/)")
SYSPATH_RE = re.compile(
    r"^([ \t]*)sys\.path\.insert\(0, str\((ROOT|REPO|Path\(__file__\)(?:\.resolve\(\))?"
    r"(?:\.parent\.parent|\.parents\[1\]))\)\)([^\n]*)\n"
    r"(?![ \t]*sys\.path\.insert\(0, str\(\2 / \"proto\"\)\))",
    re.M,
)


# What no rule rewrites (``import sys, nodeagent``): reported, for a hand.
LEFTOVER_RE = re.compile(
    rf"^[ \t]*(?:import[ \t]+[^#\n]*?(?<![\w.])|from[ \t]+)({ROOTS_RE})\b(?![-\w])", re.M
)


class ConvertError(Exception):
    """The tree cannot be converted (one line)."""


# ---------------------------------------------------------------------------------------------
# The module index: which dotted names are real modules of the three folders.


def module_index(root: Path) -> set[str]:
    """``controller``, ``controller.cli``, ``controller.cli.main``, ... as the folders have them now."""
    names: set[str] = set()
    for top in ROOTS:
        base = root / top
        if not (base / "__init__.py").is_file():
            raise ConvertError(f"{top}/__init__.py is missing: not a tether checkout?")
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            rel = Path(dirpath).relative_to(root).parts
            if "__init__.py" in filenames:
                names.add(".".join(rel))
            names.update(".".join((*rel, f[:-3])) for f in filenames if f.endswith(".py"))
    return names


# ---------------------------------------------------------------------------------------------
# Text rules.


def rewrite_imports(text: str) -> str:
    """Import statements of the old top-level packages, wherever they start a line."""
    text = FROM_RE.sub(lambda m: f"{m[1]}from {PACKAGE}.{m[2]}{m[3]} import", text)

    def one(m: re.Match[str]) -> str:
        indent, top, sub, alias = m[1], m[2], m[3], m[4]
        if not sub:
            return f"{indent}from {PACKAGE} import {top}" + (f" as {alias}" if alias else "")
        if alias:
            return f"{indent}import {PACKAGE}.{top}{sub} as {alias}"
        # ``import controller.x`` binds ``controller``: keep that name bound, and load the submodule.
        return f"{indent}import {PACKAGE}.{top}{sub}\n{indent}from {PACKAGE} import {top}"

    return IMPORT_RE.sub(one, text)


def rewrite_refs(text: str, modules: set[str]) -> str:
    """Dotted references to a real module of the folders, in free text (a string's, a comment's)."""

    def dotted(m: re.Match[str]) -> str:
        first = m[2].split(".")[1]
        return f"{PACKAGE}.{m[0]}" if f"{m[1]}.{first}" in modules else m[0]

    return DOTTED_RE.sub(dotted, text)


def rewrite_paths(text: str) -> str:
    """Installed paths: ``lib/nodeagent/`` -> ``lib/tether/nodeagent/`` (bundles, site dirs)."""
    return PATH_RE.sub(lambda m: f"{m[1]}{PACKAGE}/{m[2]}", text)


def fstring_literal_parts(token: str) -> Iterator[tuple[int, int]]:
    """(start, end) of the literal parts of an f-string token (outside ``{...}`` fields)."""
    depth, start, i = 0, 0, 0
    while i < len(token):
        ch = token[i]
        if ch in "{}" and token[i : i + 2] in ("{{", "}}"):
            i += 2
            continue
        if ch == "{":
            if depth == 0:
                yield start, i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                start = i + 1
        i += 1
    if depth == 0:
        yield start, len(token)


def rewrite_string_token(token: str, modules: set[str]) -> str:
    prefix = re.match(r"[A-Za-z]*", token)
    assert prefix is not None
    if "f" not in prefix[0].lower():
        return rewrite_paths(rewrite_refs(rewrite_imports(token), modules))
    out, last = [], 0
    for start, end in fstring_literal_parts(token):
        out.append(token[last:start])
        out.append(rewrite_refs(rewrite_imports(token[start:end]), modules))
        last = end
    out.append(token[last:])
    return rewrite_paths("".join(out))  # f"{lib}/nodeagent/..." too


@dataclass
class Rules:
    """What the rules need to know about the tree, and the prose they left alone."""

    modules: set[str]
    limit: int  # ruff's line-length: prose is not rewritten past it
    kept: list[str] = field(default_factory=list)


def is_prose(tok: tokenize.TokenInfo) -> bool:
    """A comment or a (non-f) triple-quoted string: text that ruff format will not wrap."""
    if tok.type == tokenize.COMMENT:
        return True
    prefix = re.match(r"[A-Za-z]*", tok.string)
    assert prefix is not None
    rest = tok.string[len(prefix[0]) :]
    return tok.type == tokenize.STRING and "f" not in prefix[0].lower() and rest[:3] in ('"""', "'''")


def rewrite_prose(tok: tokenize.TokenInfo, lines: list[str], rel: str, rules: Rules) -> str:
    """Line by line; a line that the longer names would take past the limit keeps the short ones."""
    out = []
    for i, piece in enumerate(tok.string.split("\n")):
        new = rewrite_paths(rewrite_refs(rewrite_imports(piece), rules.modules))
        row = tok.start[0] + i
        physical = lines[row - 1].rstrip("\n")
        if new != piece and len(physical) + len(new) - len(piece) > rules.limit >= len(physical):
            rules.kept.append(
                f"{rel}:{row}: short form kept (the line would pass {rules.limit}): {piece.strip()}"
            )
            new = piece
        out.append(new)
    return "\n".join(out)


def rewrite_python(text: str, rel: str, rules: Rules) -> str:
    """Imports anywhere; references only inside string and comment tokens (code is left alone)."""
    text = rewrite_imports(text)
    text = SYSPATH_RE.sub(
        lambda m: f'{m[0]}{m[1]}sys.path.insert(0, str({m[2]} / "proto"))  # the {PACKAGE} package\n', text
    )
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    edits: list[tuple[int, int, str]] = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError) as exc:
        raise ConvertError(f"cannot tokenize: {exc}") from None
    for tok in tokens:
        if tok.type not in (tokenize.STRING, tokenize.COMMENT):
            continue
        if is_prose(tok):
            new = rewrite_prose(tok, lines, rel, rules)
        else:
            new = rewrite_string_token(tok.string, rules.modules)
        if new != tok.string:
            start = offsets[tok.start[0] - 1] + tok.start[1]
            end = offsets[tok.end[0] - 1] + tok.end[1]
            edits.append((start, end, new))
    for start, end, new in reversed(edits):
        text = text[:start] + new + text[end:]
    return text


def rewrite_text(text: str, modules: set[str]) -> str:
    return rewrite_paths(rewrite_refs(rewrite_imports(text), modules))


# ---------------------------------------------------------------------------------------------
# pyproject.toml


def _list_edit(text: str, key: str, edit: Callable[[list[str]], list[str]]) -> str:
    """Edit the string list of ``key = [...]`` (the first such line) through ``edit``."""
    pattern = re.compile(rf"^({re.escape(key)}[ \t]*=[ \t]*)\[([^\]\n]*)\]", re.M)
    m = pattern.search(text)
    if m is None:
        return text
    items = re.findall(r'"([^"]*)"', m[2])
    new_items = edit(items)
    if new_items == items:
        return text
    return text[: m.start()] + m[1] + "[" + ", ".join(f'"{i}"' for i in new_items) + "]" + text[m.end() :]


def _section(text: str, name: str) -> tuple[int, int]:
    """(start, end) of a TOML table's body, or (-1, -1)."""
    m = re.search(rf"^\[{re.escape(name)}\][ \t]*\n", text, re.M)
    if m is None:
        return -1, -1
    nxt = re.search(r"^\[", text[m.end() :], re.M)
    return m.end(), m.end() + nxt.start() if nxt else len(text)


def _in_section(text: str, name: str, fn: Callable[[str], str]) -> str:
    start, end = _section(text, name)
    if start < 0:
        return text
    return text[:start] + fn(text[start:end]) + text[end:]


def without_roots(items: list[str]) -> list[str]:
    return [i for i in items if i.rstrip("*") not in ROOTS]


def rewrite_pyproject(text: str, modules: set[str]) -> str:
    text = rewrite_text(text, modules)  # entry points

    def find(body: str) -> str:
        body = _list_edit(body, "where", lambda items: ["proto"])
        body = _list_edit(body, "include", lambda items: [PACKAGE, f"{PACKAGE}.*"])
        return body.replace(
            "# The generated package ``tether.v1`` lives in proto/ next to its .proto files.\n",
            "# One import package, tether: proto/tether (the generated tether.v1 next to its .proto\n"
            "# files) and its committed links controller, nodeagent, bootstrap -> ../../<folder>.\n",
        )

    text = _in_section(text, "tool.setuptools.packages.find", find)

    def mypy(body: str) -> str:
        body = _list_edit(
            body,
            "packages",
            lambda items: [PACKAGE, *without_roots(items)] if PACKAGE not in items else without_roots(items),
        )
        return _list_edit(
            body,
            "exclude",
            lambda items: [f"^proto/{PACKAGE}/v1/" if i == f"^proto/{PACKAGE}/" else i for i in items],
        )

    text = _in_section(text, "tool.mypy", mypy)
    text = text.replace(
        f'[[tool.mypy.overrides]]\nmodule = ["{PACKAGE}.*"]\n',
        f'[[tool.mypy.overrides]]\nmodule = ["{PACKAGE}.v1.*"]\n',
    )
    return _in_section(
        text, "tool.ruff.lint.isort", lambda b: _list_edit(b, "known-first-party", without_roots)
    )


# ---------------------------------------------------------------------------------------------
# Structural edits no rule can make: (path, old, new); applied before the rules, once.


@dataclass(frozen=True)
class Patch:
    """Replace ``old`` (once) by ``new`` while ``stale`` says the file still needs it (default: ``old``
    is there); a stale file without ``old`` needs a hand."""

    path: str
    old: str
    new: str
    why: str
    stale: Callable[[str], bool] | None = None
    optional: bool = False  # prose: when it cannot apply, a note, not a failure

    def needed(self, text: str) -> bool:
        return self.stale(text) if self.stale else self.old in text


def has(pattern: str) -> Callable[[str], bool]:
    return lambda text: re.search(pattern, text, re.M) is not None


PATCHES = (
    Patch(
        "bootstrap/bundle.py",
        'PACKAGES = ("nodeagent", "tether")  # ours, copied as source\n',
        'PACKAGES = ("tether.nodeagent", "tether.v1")  # ours, copied as source (never the controller)\n',
        "the bundle ships tether/__init__.py, tether.nodeagent and tether.v1 only",
        has(r'^PACKAGES = \(.*"nodeagent"'),
    ),
    Patch(
        "bootstrap/bundle.py",
        """def _package_files() -> list[tuple[str, bytes]]:
    import tether

    files = []
    for module in (nodeagent, tether):
        root = Path(module.__file__ or "").parent
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            files.append((f"{root.name}/{path.relative_to(root).as_posix()}", path.read_bytes()))
    return files
""",
        """def _package_files() -> list[tuple[str, bytes]]:
    \"\"\"Our source in the bundle, by module path: ``tether/*.py`` and the ``PACKAGES``.\"\"\"
    import tether

    top = Path(tether.__file__ or "").parent
    files = [(f"tether/{path.name}", path.read_bytes()) for path in sorted(top.glob("*.py"))]
    for name in PACKAGES:
        root = Path(importlib.import_module(name).__file__ or "").parent
        prefix = name.replace(".", "/")
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            files.append((f"{prefix}/{path.relative_to(root).as_posix()}", path.read_bytes()))
    return files
""",
        "the bundle's files by module path (tether/nodeagent/..., not nodeagent/...)",
        has(r"for module in \(nodeagent, tether\)"),
    ),
    Patch(
        "bootstrap/bundle.py",
        "import hashlib\nimport importlib.metadata\n",
        "import hashlib\nimport importlib\nimport importlib.metadata\n",
        "importlib.import_module for the bundle's packages",
        lambda text: "importlib.import_module(" in text and not has(r"^import importlib$")(text),
    ),
    Patch(
        "bootstrap/bundle.py",
        "``lib/`` next to our ``nodeagent`` and generated ``tether`` packages, and the lot is written as a\n",
        "``lib/`` next to our ``tether`` package (``tether.nodeagent`` and the generated ``tether.v1``,\n"
        "never the controller), and the lot is written as a\n",
        "docstring",
    ),
    Patch(
        "bootstrap/bundle.py",
        "    lib/              unpacked wheels + nodeagent/ + tether/\n",
        "    lib/              unpacked wheels + tether/ (__init__.py, nodeagent/, v1/)\n",
        "docstring",
    ),
    Patch(
        "nodeagent/upgrade.py",
        """        if len(here.parents) < 4:
            return None
        bundle = here.parents[2]  # <agents>/<id>/lib/nodeagent/__init__.py
        agents = bundle.parent
        if here.parents[1].name != "lib" or not (bundle / "BUNDLE.json").is_file():
            return None
""",
        """        depth = nodeagent.__name__.count(".") + 1  # <agents>/<id>/lib/tether/nodeagent/__init__.py
        if len(here.parents) < depth + 3:
            return None
        lib = here.parents[depth]
        bundle = lib.parent
        agents = bundle.parent
        if lib.name != "lib" or not (bundle / "BUNDLE.json").is_file():
            return None
""",
        "an install is found at lib/tether/nodeagent/ (one level deeper)",
        has(r'here\.parents\[1\]\.name != "lib"'),
    ),
    Patch(
        "tests/integration/agent_bundles.py",
        """    shutil.copytree(
        Path(nodeagent.__file__).parent, src / "nodeagent", ignore=shutil.ignore_patterns("__pycache__")
    )
    init = src / "nodeagent/__init__.py"
""",
        """    shutil.copytree(  # the whole package (links followed): this copy's nodeagent is the one found
        Path(tether.__file__).parent, src / "tether", ignore=shutil.ignore_patterns("__pycache__")
    )
    init = src / "tether/nodeagent/__init__.py"
""",
        "the copy of the source is the whole tether package",
        has(r'src / "nodeagent"'),
    ),
    Patch(
        "tests/integration/agent_bundles.py",
        "\nimport nodeagent\n\nBUILD",
        "\nimport tether\nimport nodeagent\n\nBUILD",
        "the copy of the source is the whole tether package",
        lambda text: "tether.__file__" in text and not has(r"^import tether$")(text),
    ),
    Patch(
        "tests/unit/bootstrap/test_bundle.py",
        '    assert "lib/nodeagent/main.py" in members\n',
        '    assert "lib/tether/nodeagent/main.py" in members and "lib/tether/__init__.py" in members\n'
        '    operator_side = ("lib/tether/controller/", "lib/tether/bootstrap/")\n'
        "    assert not [m for m in members if m.startswith(operator_side)]\n",
        "the bundle holds the agent, never the controller or the bootstrap",
    ),
    Patch(
        "README.md",
        "\n| `proto/tether/v1/` | the gRPC contract",
        "\n| `proto/tether/` | the one import package, `tether`: `tether.v1` and the links `controller`,"
        " `nodeagent`, `bootstrap` to the folders below (`tether.controller`, ...) |"
        "\n| `proto/tether/v1/` | the gRPC contract",
        "the layout table names the import package",
        lambda text: "| `proto/tether/` |" not in text,
        optional=True,
    ),
    Patch(
        "Makefile",
        "rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info\n",
        "rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info proto/*.egg-info\n",
        "make clean: setuptools writes the egg-info next to the package, in proto/",
    ),
)


def apply_patches(texts: dict[str, str], notes: list[str]) -> list[str]:
    """Apply each patch once; the ones still needed whose code has changed (optional ones: notes)."""
    stuck = []
    for patch in PATCHES:
        text = texts.get(patch.path)
        if text is None:
            continue  # not in this tree (or not text): nothing to patch
        if not patch.needed(text):
            continue
        if text.count(patch.old) != 1:
            (notes if patch.optional else stuck).append(f"{patch.path}: changed, edit by hand: {patch.why}")
            continue
        texts[patch.path] = text.replace(patch.old, patch.new)
    return stuck


# ---------------------------------------------------------------------------------------------
# The tree.


def tree_files(root: Path) -> list[str]:
    """Files git knows (tracked, or new and not ignored), relative paths; symlinks excluded."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ConvertError(f"git ls-files failed in {root}: {exc}") from None
    names = sorted(set(filter(None, out.split("\0"))))
    return [
        n
        for n in names
        if not n.startswith(SKIP_PREFIXES) and (root / n).is_file() and not (root / n).is_symlink()
    ]


def read_text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def is_python(rel: str, text: str) -> bool:
    return rel.endswith((".py", ".pyi")) or bool(re.match(r"#![^\n]*python", text))


def convert_file(rel: str, text: str, rules: Rules) -> str:
    if rel == "pyproject.toml":
        return rewrite_pyproject(text, rules.modules)
    if is_python(rel, text):
        return rewrite_python(text, rel, rules)
    return rewrite_text(text, rules.modules)


def line_limit(root: Path) -> int:
    """ruff's line-length from pyproject.toml (88, ruff's default, without one)."""
    path = root / "pyproject.toml"
    m = re.search(r"^line-length[ \t]*=[ \t]*(\d+)", path.read_text() if path.is_file() else "", re.M)
    return int(m[1]) if m else 88


def link_problems(root: Path) -> list[str]:
    problems = []
    for top in ROOTS:
        link = root / PACKAGE_DIR / top
        want = os.path.join("..", "..", top)
        if not link.is_symlink() or os.readlink(link) != want:
            problems.append(f"{PACKAGE_DIR / top}: should be a symlink to {want}")
    return problems


def make_links(root: Path) -> None:
    for top in ROOTS:
        link = root / PACKAGE_DIR / top
        want = os.path.join("..", "..", top)
        if link.is_symlink() and os.readlink(link) == want:
            continue
        if link.exists() or link.is_symlink():
            raise ConvertError(
                f"{PACKAGE_DIR / top} exists and is not the link to {want}: move it away first"
            )
        link.symlink_to(want, target_is_directory=True)


def ruff(root: Path) -> str | None:
    for candidate in (Path(sys.executable).with_name("ruff"), root / ".venv" / "bin" / "ruff"):
        if candidate.is_file():
            return str(candidate)
    return shutil.which("ruff")


def tidy(root: Path, changed: list[str]) -> None:
    """isort and format the Python files this run changed (import order moves with the names)."""
    py = [rel for rel in changed if rel.endswith(".py")]
    exe = ruff(root)
    if not py:
        return
    if exe is None:
        print("one_package: ruff not found: run `ruff check --select I --fix` and `ruff format` on", *py)
        return
    subprocess.run([exe, "check", "--quiet", "--select", "I", "--fix", *py], cwd=root, check=False)
    subprocess.run([exe, "format", "--quiet", *py], cwd=root, check=False)


def diff_lines(old: str, new: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of the lines of ``old`` that the conversion changes."""
    a, b = old.splitlines(), new.splitlines()
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            for number in range(i1, i2):
                yield number + 1, a[number].strip()


def run(root: Path, check: bool) -> int:
    rules = Rules(module_index(root), line_limit(root))
    problems = link_problems(root)
    if not check:
        make_links(root)
    originals: dict[str, str] = {}
    for rel in tree_files(root):
        text = read_text(root / rel)
        if text is not None:
            originals[rel] = text
    texts = dict(originals)
    stuck = apply_patches(texts, rules.kept)
    changed = []
    for rel, text in sorted(texts.items()):
        try:
            new = convert_file(rel, text, rules)
        except ConvertError as exc:
            stuck.append(f"{rel}: {exc}")
            continue
        for m in LEFTOVER_RE.finditer(new if is_python(rel, new) else ""):
            line = new.count("\n", 0, m.start()) + 1
            stuck.append(f"{rel}:{line}: an import no rule rewrites, edit by hand: {m[0].strip()}")
        if new != originals.get(rel):
            changed.append(rel)
            if check:
                lines = list(diff_lines(originals.get(rel, ""), new)) or [(0, "(lines to add)")]
                problems += [f"{rel}:{n}: {line}" for n, line in lines]
            else:
                (root / rel).write_text(new)
    for line in rules.kept:
        print(f"one_package: note: {line}")
    if check:
        for line in [*problems, *stuck]:
            print(line)
        print(f"one_package: {len(problems) + len(stuck)} old-style item(s) in {len(changed)} file(s)")
        return 1 if problems or stuck else 0
    tidy(root, changed)
    for line in stuck:
        print(f"one_package: NOT DONE: {line}", file=sys.stderr)
    print(f"one_package: {len(changed)} file(s) rewritten; links in {PACKAGE_DIR}")
    return 2 if stuck else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if anything old-style remains"
    )
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent, help="the tree")
    args = p.parse_args(argv)
    try:
        return run(args.root.resolve(), args.check)
    except ConvertError as exc:
        print(f"one_package: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
