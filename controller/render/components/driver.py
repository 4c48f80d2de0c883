"""NVIDIA driver: CUDA-repository package (branch or exact version, strict check), runfile
(URL + sha256; under holodeck's apiVersion the sha256 may be missing, and then the step and the
node's provenance say the download was not verified) or the open kernel modules built from git.
Rendered for GPU nodes only."""

from __future__ import annotations

from tether.controller.render import downloads
from tether.controller.render.shell import q
from tether.controller.render.steps import RenderInput, make_step
from tether.nodeagent.model import Step

CUDA_REPOS = "https://developer.download.nvidia.com/compute/cuda/repos"


def _requested(inp: RenderInput) -> dict[str, str]:
    d = inp.spec.driver
    if d.source == "runfile" and not d.runfile_sha256:
        return {"source": "runfile", "url": d.runfile_url, "verified": "no: the spec gives no checksum"}
    if d.source == "runfile":
        return {"source": "runfile", "url": d.runfile_url, "sha256": d.runfile_sha256}
    if d.source == "git" and d.git is not None:
        return {"source": "git", "repo": d.git.repo, "ref": d.git.ref}
    pin = {"version": d.version} if d.version else {"branch": d.branch}
    return {"source": "package", **pin}


def steps(inp: RenderInput) -> list[Step]:
    d = inp.spec.driver
    if not d.install:
        return []
    base = f"{CUDA_REPOS}/{inp.target.cuda_repo}/"
    apt = inp.target.pm == "apt"
    context = {
        "source": d.source,
        "want": q(d.version or d.branch),
        "exact": bool(d.version),
        "package": q("nvidia-open" if inp.target.family == "amazon" else "cuda-drivers"),
        "repo_url": q(base),
        "key_url": q(base + ("3bf863cc.pub" if apt else "D42D0685.pub")),
        "key_fingerprint": q(downloads.CUDA_KEY_FINGERPRINT if apt else ""),
        "runfile_url": q(d.runfile_url),
        "runfile_sha256": q(d.runfile_sha256),
        "runfile_verified": bool(d.runfile_sha256),
        "git_repo": q(d.git.repo if d.git else ""),
        "git_ref": q(d.git.ref if d.git else ""),
    }
    return [
        make_step(
            inp,
            name="nvidia-driver",
            component="nvidia-driver",
            phase="driver",
            template="driver.j2",
            timeout=3600,
            requested=_requested(inp),
            description=f"NVIDIA driver from {d.source}"
            + (
                " (download NOT verified: no checksum)"
                if d.source == "runfile" and not d.runfile_sha256
                else ""
            ),
            context=context,
        )
    ]
