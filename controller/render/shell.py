"""Shell-safe values for templates.

Every ``{{ ... }}`` in a component template must produce a ``ShellWord`` (a value quoted with
``shlex.quote`` by the ``q`` filter), a ``Trusted`` constant computed by our own Python from
fixed tables, an int, or the user's own script text (``UserCode``). Anything else, a plain
``str`` above all, makes rendering fail: a template cannot interpolate a spec value into shell
syntax unquoted by accident.
"""

from __future__ import annotations

import shlex
from typing import Any


class ShellWord(str):
    """A value already quoted for bash."""


class Trusted(str):
    """A fixed string from tether's own tables (never from a spec); safe to emit as is."""


class UserCode(str):
    """A custom template's script text: the user's code, run as such by design."""


def q(value: Any) -> ShellWord:
    """Quote one value (or a list of values, space-joined) as bash words."""
    if isinstance(value, (list, tuple)):
        return ShellWord(" ".join(shlex.quote(str(v)) for v in value))
    if isinstance(value, bool):
        return ShellWord("true" if value else "false")
    return ShellWord(shlex.quote(str(value)))


def finalize(value: Any) -> Any:
    """jinja2 ``finalize`` hook: refuse anything that is not quoted or known to be safe."""
    if isinstance(value, (ShellWord, Trusted, UserCode)):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise TypeError(f"unquoted value in template: {value!r} (use the q filter)")
