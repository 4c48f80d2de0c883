"""The systemd unit the bootstrap installs (``packaging/systemd/tether-agent.service``).

``bootstrap/tether-agent.service`` is a symbolic link to the packaged file, so the unit has one
source and still ships inside the ``bootstrap`` package (package data ``*.service``).
"""

from __future__ import annotations

from importlib import resources

from tether.bootstrap.layout import DEFAULT_LAYOUT, Layout


def unit_text(layout: Layout = DEFAULT_LAYOUT) -> str:
    """The unit file, with its paths moved when ``layout`` is not the default one."""
    text = resources.files("tether.bootstrap").joinpath("tether-agent.service").read_text()
    default = DEFAULT_LAYOUT
    for old, new in (
        (default.launcher, layout.launcher),
        (default.config, layout.config),
        (default.disabled, layout.disabled),
    ):
        text = text.replace(old, new)
    return text
