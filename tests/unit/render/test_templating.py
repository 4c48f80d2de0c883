"""The jinja2 environment the templates render in: StrictUndefined and the sandbox."""

from __future__ import annotations

from typing import Any

import jinja2
import pytest
from jinja2.exceptions import SecurityError

from tests.unit.render import scenarios
from tether.controller.render import steps
from tether.controller.render.templating import ENV, render_template


def test_a_missing_variable_is_an_error_not_an_empty_string() -> None:
    """With jinja2's default Undefined these would render ``x=''`` and skip the branch silently."""
    assert ENV.from_string("x={{ present | q }}").render(present="a b") == "x='a b'"
    with pytest.raises(jinja2.UndefinedError, match="missing"):
        ENV.from_string("x={{ missing | q }}").render()
    with pytest.raises(jinja2.UndefinedError, match="missing"):
        ENV.from_string("{% if missing %}yes{% endif %}").render()
    with pytest.raises(jinja2.UndefinedError, match="missing"):
        ENV.from_string("{% for x in missing %}{{ x | q }}{% endfor %}").render()


def _contexts(monkeypatch: pytest.MonkeyPatch, scenario: str) -> dict[str, dict[str, Any]]:
    """The context each component template of a scenario's plan is rendered with."""
    seen: dict[str, dict[str, Any]] = {}

    def capture(name: str, context: dict[str, Any]) -> str:
        seen[name] = dict(context)
        return render_template(name, context)

    monkeypatch.setattr(steps, "render_template", capture)
    scenarios.plan_for(scenario, "ubuntu-22.04")
    return seen


def test_component_templates_refuse_an_incomplete_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flag the renderer forgot to pass is an error, not false: the default Undefined would
    silently drop the GPU configuration, the user's config, or the release branch."""
    context = _contexts(monkeypatch, "kind-release")["kind.j2"]
    assert "nvidia-ctk runtime configure" in render_template("kind.j2", context)
    for key in ("gpu", "user_config", "source"):
        with pytest.raises(jinja2.UndefinedError, match=key):
            render_template("kind.j2", {k: v for k, v in context.items() if k != key})
    # A bare {{ value }} is caught as well (shell.finalize refuses the Undefined it receives).
    with pytest.raises((jinja2.UndefinedError, TypeError)):
        render_template("kind.j2", {k: v for k, v in context.items() if k != "kind_url"})


def test_templates_render_in_a_sandbox() -> None:
    with pytest.raises(SecurityError):
        ENV.from_string("{{ x.__class__.__mro__ | q }}").render(x="")
    with pytest.raises(SecurityError):
        ENV.from_string("{{ f.__globals__ | q }}").render(f=test_templates_render_in_a_sandbox)
