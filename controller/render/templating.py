"""The sandboxed jinja2 environment the component templates render in.

Templates (``components/*.j2``) are read once, at import, into a ``DictLoader``: rendering
itself touches no file. ``StrictUndefined`` turns a missing variable into an error and
``shell.finalize`` refuses unquoted values.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import jinja2
from jinja2.sandbox import SandboxedEnvironment

from tether.controller.render import shell


def _load_templates() -> dict[str, str]:
    folder = resources.files("tether.controller.render.components")
    return {p.name: p.read_text() for p in folder.iterdir() if p.name.endswith(".j2")}


TEMPLATES = _load_templates()

ENV = SandboxedEnvironment(
    loader=jinja2.DictLoader(TEMPLATES),
    undefined=jinja2.StrictUndefined,
    finalize=shell.finalize,
    autoescape=False,
    comment_start_string="{##",  # bash uses {# (${#array[@]})
    comment_end_string="##}",
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)
ENV.filters["q"] = shell.q


def render_template(name: str, context: dict[str, Any]) -> str:
    return ENV.get_template(name).render(**context)
