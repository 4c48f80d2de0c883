"""Docker Engine from Docker's repository (the distribution's on Amazon Linux), or dockerd built
from git / a branch tip over the packaged engine; with ``containerRuntime.smokeTest`` a
``docker run --rm hello-world`` after it; plus cri-dockerd when kubeadm needs a CRI."""

from __future__ import annotations

from tether.controller.render import downloads
from tether.controller.render.components import runtime_common
from tether.controller.render.shell import q
from tether.controller.render.steps import RenderInput, make_step
from tether.controller.spec import defaults
from tether.nodeagent.model import Step

SMOKE_TEST_IMAGE = "hello-world"


def steps(inp: RenderInput) -> list[Step]:
    rt = inp.spec.runtime
    native = inp.target.family == "amazon"
    packages = (
        [rt.package_name] if rt.package_name else (["docker"] if native else ["docker-ce", "docker-ce-cli"])
    )
    if rt.source == "package":
        requested = {"source": "package", "package": packages[0], "version": rt.version or "newest"}
    else:
        requested = runtime_common.git_requested(rt.source, rt.git)
    context = {
        "source": rt.source,
        "packages": q(packages),
        "extra": q([] if native or rt.package_name else ["containerd.io"]),
        "version": q(rt.version),
        **runtime_common.docker_repo(inp),
        **runtime_common.git_context(rt.git),
    }
    out = [
        make_step(
            inp,
            name="docker",
            component="docker",
            phase="runtime",
            template="docker.j2",
            timeout=3600 if rt.source != "package" else 1200,
            requested=requested,
            description=f"Docker Engine from {rt.source}",
            context=context,
        )
    ]
    if rt.smoke_test:
        out.append(_smoke_test(inp))
    k8s = inp.spec.kubernetes
    if k8s.install and k8s.installer == "kubeadm":
        out.append(_cri_dockerd(inp))
    return out


def _smoke_test(inp: RenderInput) -> Step:
    """containerRuntime.smokeTest: holodeck runs ``docker run hello-world`` after every Docker
    install; tether does when the spec asks (the image must be reachable from the node)."""
    image = inp.spec.runtime.smoke_test_image or SMOKE_TEST_IMAGE
    return make_step(
        inp,
        name="docker-smoke-test",
        component="docker",
        phase="runtime",
        template="docker_smoke_test.j2",
        timeout=600,
        requested={"image": image},
        description=f"docker run --rm {image}: Docker runs a real container",
        context={"image": q(image)},
    )


def _cri_dockerd(inp: RenderInput) -> Step:
    version = defaults.CRI_DOCKERD_VERSION
    dl = downloads.cri_dockerd(version, inp.target.arch)
    return make_step(
        inp,
        name="cri-dockerd",
        component="cri-dockerd",
        phase="runtime",
        template="cri_dockerd.j2",
        timeout=600,
        requested={"source": "release", "version": version},
        description="cri-dockerd, the CRI endpoint kubelet uses with Docker",
        context={"version": q(version), "url": q(dl.url), "check": q(dl.check)},
    )
