"""Rendering: a pure function from (spec, node) to an ordered plan.

Modules: ``plan`` (``render`` and the order), ``context`` (``NodeContext``, the derived
``Target``), ``steps`` (template -> ``Step``), ``templating`` (sandboxed jinja2), ``shell``
(quoting rules the templates cannot bypass), ``downloads`` (upstream artifacts and their
checks), ``targets`` (OS presets for offline rendering), ``components/`` (one module and one
template per component).
"""

from tether.controller.render.context import NodeContext
from tether.controller.render.plan import render

__all__ = ["NodeContext", "render"]
