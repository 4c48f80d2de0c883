"""Kernel pin: install, make it the boot default, reboot (the agent does it), verify."""

from __future__ import annotations

from tether.controller.render.shell import q
from tether.controller.render.steps import RenderInput, make_step
from tether.nodeagent.model import Step


def steps(inp: RenderInput) -> list[Step]:
    kernel = inp.spec.kernel
    if kernel is None:
        return []
    requested = {"version": kernel.version}
    context = {"version": q(kernel.version)}
    return [
        make_step(
            inp,
            name="kernel",
            component="kernel",
            phase="kernel",
            template="kernel.j2",
            timeout=1800,
            requested=requested,
            description="installs the pinned kernel and makes it the boot default; the agent reboots",
            reboot=True,
            context=context,
        ),
        make_step(
            inp,
            name="kernel-verify",
            component="kernel",
            phase="kernel",
            template="kernel_verify.j2",
            timeout=60,
            requested=requested,
            description="checks that the pinned kernel is the one running after the reboot",
            context=context,
        ),
    ]
