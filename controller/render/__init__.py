"""Rendering: a pure function from (spec, node) to an ordered plan."""

from controller.render.plan import NodeContext, render

__all__ = ["NodeContext", "render"]
