"""Custom templates: the user's scripts at five phases, inline (a ``file:`` arrives inlined) or
fetched by the node from an https URL through the download mirror and checked against its
sha256 before it runs. ``env`` becomes the process environment (never script text), the
timeout is enforced by the agent, ``continueOnError`` lets the plan go on past a failure."""

from __future__ import annotations

from collections.abc import Callable

from tether.controller.render.shell import UserCode, q
from tether.controller.render.steps import RenderInput, make_step
from tether.controller.spec.model import CustomTemplate
from tether.nodeagent.model import Step


def _step(inp: RenderInput, t: CustomTemplate) -> Step:
    if t.url:
        requested = {"source": "url", "url": t.url, "sha256": t.sha256}
    else:
        requested = {"source": "inline", **({"sha256": t.sha256} if t.sha256 else {})}
    return make_step(
        inp,
        name=f"custom-{t.name}",
        component="custom",
        phase=t.phase,
        template="custom.j2",
        timeout=t.timeout_seconds,
        requested=requested,
        description=f"custom template {t.name}",
        env=t.env,
        continue_on_error=t.continue_on_error,
        context={
            "name": q(t.name),
            "phase_word": q(t.phase),
            "has_url": bool(t.url),
            "url": q(t.url),
            "sha256": q(t.sha256),
            "code": UserCode(t.inline.rstrip("\n")),
        },
    )


def phase(name: str) -> Callable[[RenderInput], list[Step]]:
    """The steps of one phase's templates that target this node's role, in YAML order."""

    def section(inp: RenderInput) -> list[Step]:
        return [
            _step(inp, t) for t in inp.spec.custom_templates if t.phase == name and inp.node.role in t.roles
        ]

    return section
