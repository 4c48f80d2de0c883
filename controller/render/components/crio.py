"""CRI-O from the isv:cri-o repository (stable track vX.Y, optionally a pinned patch), or built
from git / a branch tip; configured for systemd cgroups and the pinned pause image."""

from __future__ import annotations

from tether.controller.render.components import runtime_common
from tether.controller.render.shell import Trusted, q
from tether.controller.render.steps import RenderInput, make_step
from tether.controller.spec import checks, defaults
from tether.nodeagent.model import Step

CRIO_REPOS = "https://download.opensuse.org/repositories/isv:/cri-o:/stable:"


def track_and_pin(version: str) -> tuple[str, str]:
    """``v1.33`` -> (v1.33, ""); ``v1.33.2`` -> (v1.33, 1.33.2)."""
    m = checks.SEMVER_RE.fullmatch(version)
    if m:
        return f"v{m.group(1)}.{m.group(2)}", version.removeprefix("v")
    return ("v" + version.removeprefix("v")), ""


def steps(inp: RenderInput) -> list[Step]:
    rt = inp.spec.runtime
    track, pin = track_and_pin(rt.version or defaults.CRIO_VERSION)
    apt = inp.target.pm == "apt"
    base = f"{CRIO_REPOS}/{track}/{'deb' if apt else 'rpm'}/"
    if rt.source == "package":
        requested = {"source": "package", "track": track, "version": pin or "newest"}
    else:
        requested = runtime_common.git_requested(rt.source, rt.git)
    context = {
        "source": rt.source,
        "package": q(rt.package_name or "cri-o"),
        "pin": q(pin),
        "repo_url": q(base),
        "key_url": q(base + ("Release.key" if apt else "repodata/repomd.xml.key")),
        "pause_literal": Trusted(defaults.PAUSE_IMAGE),
        **runtime_common.git_context(rt.git),
        **runtime_common.build_deps(inp),
    }
    return [
        make_step(
            inp,
            name="crio",
            component="crio",
            phase="runtime",
            template="crio.j2",
            timeout=3600 if rt.source != "package" else 1200,
            requested=requested,
            description=f"CRI-O from {rt.source}",
            context=context,
        )
    ]
