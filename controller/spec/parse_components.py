"""Readers for the node components: kernel, NVIDIA driver, container runtime, container toolkit."""

from __future__ import annotations

from tether.controller.spec import checks, defaults
from tether.controller.spec.model import RUNTIMES, DriverSpec, GitSource, KernelSpec, RuntimeSpec, ToolkitSpec
from tether.controller.spec.reader import Check, Section

DEPRECATED = "deprecated alias of {}; still accepted"


def git_source(parent: Section, source: str, default_repo: str, default_track: str) -> GitSource | None:
    """The ``git`` block (ref required) or the ``latest`` block (track, default branch)."""
    if source not in ("git", "latest"):
        for name in ("git", "latest"):
            if parent.has(name):
                parent.problems.note(parent.path_of(name), f"ignored: source is {source}")
                parent.lookup(name)
        return None
    block = parent.section(source)
    if block is None:
        if source == "git":
            parent.problems.add(parent.path_of("git"), "required when source is git (with repo and ref)")
            return None
        return GitSource(repo=default_repo, ref=default_track)
    repo = checks.normalize_git_repo(block.string("repo", default_repo))
    reason = checks.check_url(repo)
    if reason:
        parent.problems.add(block.path_of("repo"), f"{reason} (or owner/name on GitHub)")
        repo = default_repo
    if source == "git":
        ref = block.string("ref", check=checks.check_git_ref, required=True)
    else:
        ref = block.string("track", default_track, check=checks.check_git_ref)
    block.finish()
    return GitSource(repo=repo, ref=ref) if ref else None


def legacy(section: Section, name: str, current: str, current_path: str, check: Check) -> str:
    """Fold a deprecated top-level field into its new home; both set and different is a problem."""
    if not section.has(name):
        return current
    old = section.string(name, check=check)
    if old:
        section.problems.note(section.path_of(name), DEPRECATED.format(current_path))
    if current and old and current != old:
        section.problems.add(section.path_of(name), f"conflicts with {current_path} ({old!r} != {current!r})")
        return current
    return current or old


def kernel(spec: Section) -> KernelSpec | None:
    sec = spec.section("kernel")
    if sec is None:
        return None
    version = sec.string("version", check=checks.check_kernel)
    sec.finish()
    return KernelSpec(version=version) if version else None


def driver(spec: Section) -> DriverSpec:
    sec = spec.section("nvidiaDriver")
    if sec is None:
        return DriverSpec()
    install = sec.boolean("install")
    source = sec.choice("source", ("package", "runfile", "git"), "package")
    branch = version = url = sha = ""
    pkg = sec.section("package") if source == "package" else None
    if pkg is not None:
        branch = pkg.string("branch", check=checks.check_branch)
        version = pkg.string("version", check=checks.check_package_version)
        pkg.finish()
    base = sec.path_of("package")
    branch = legacy(sec, "branch", branch, f"{base}.branch", checks.check_branch)
    version = legacy(sec, "version", version, f"{base}.version", checks.check_package_version)
    if branch and version and not version.startswith(branch + "."):
        sec.problems.add(f"{base}.version", f"version {version} is not on branch {branch}")
    if source == "package" and not version and not branch:
        branch = defaults.DRIVER_BRANCH
    if source == "runfile":
        url, sha = _runfile(sec)
    elif sec.has("runfile"):
        sec.problems.note(sec.path_of("runfile"), f"ignored: source is {source}")
        sec.lookup("runfile")
    git = git_source(sec, source, defaults.DRIVER_GIT_REPO, defaults.LATEST_TRACK)
    if source != "package" and sec.has("package"):
        sec.problems.note(sec.path_of("package"), f"ignored: source is {source}")
        sec.lookup("package")
    sec.finish()
    return DriverSpec(
        install=install,
        source=source,
        branch=branch,
        version=version,
        runfile_url=url,
        runfile_sha256=sha,
        git=git,
    )


def _runfile(sec: Section) -> tuple[str, str]:
    """``nvidiaDriver.runfile``: (url, sha256 hex or "")."""
    run = sec.section("runfile")
    if run is None:
        sec.problems.add(sec.path_of("runfile"), "required when source is runfile (url and checksum)")
        return "", ""
    url = run.string("url", check=checks.check_url, required=True)
    # holodeck's checksum is optional (its driver_runfile example has none): accepted
    # under its apiVersion, loudly, and the node records the download as unverified.
    before = len(sec.problems.items)
    raw = run.string("checksum", check=checks.check_sha256)
    sha = checks.normalize_sha256(raw) or ""
    missing = not raw and len(sec.problems.items) == before  # absent or empty, not malformed
    if missing and not sec.problems.holodeck:
        sec.problems.add(run.path_of("checksum"), "required")
    elif missing:
        sec.problems.note(
            run.path_of("checksum"),
            "WARNING: none given, so the runfile download is NOT verified (the node records "
            "it as unverified); add sha256:<64 hex digits> (tether.dev/v1alpha1 requires it)",
        )
    run.finish()
    return url, sha


def _runtime_version(name: str, raw: str) -> str:
    if name == "containerd":
        return raw.removeprefix("v")
    return raw


def runtime(spec: Section) -> RuntimeSpec:
    sec = spec.section("containerRuntime")
    if sec is None:
        return RuntimeSpec()
    install = sec.boolean("install")
    name = sec.string("name") or "containerd"
    if name not in RUNTIMES:
        sec.problems.add(sec.path_of("name"), f"must be one of {', '.join(RUNTIMES)} (got {name!r})")
        name = "containerd"
    source = sec.choice("source", ("package", "git", "latest"), "package")
    version = package_name = ""
    pkg = sec.section("package")
    version_check = checks.check_minor_or_semver if name == "crio" else checks.check_package_version
    if pkg is not None:
        version = pkg.string("version", check=version_check)
        package_name = pkg.string("name", check=checks.check_package_name)
        pkg.finish()
        if source != "package":
            sec.problems.note(pkg.path, f"ignored: source is {source}")
    version = legacy(sec, "version", version, f"{sec.path_of('package')}.version", version_check)
    version = _runtime_version(name, version)
    if source == "package" and not version:
        # containerd's default pin (Docker's repository only) is applied at render time.
        version = defaults.CRIO_VERSION if name == "crio" else ""
    git = git_source(sec, source, defaults.GIT_REPOS[name], defaults.LATEST_TRACK)
    smoke_test = sec.boolean("smokeTest")
    smoke_image = sec.string("smokeTestImage", check=checks.check_image_ref)
    if (smoke_test or smoke_image) and name != "docker":
        sec.problems.add(
            sec.path_of("smokeTest" if smoke_test else "smokeTestImage"),
            "only with Docker (holodeck's docker run hello-world after the install)",
        )
    sec.finish()
    return RuntimeSpec(
        install=install,
        name=name,
        source=source,
        version=version if source == "package" else "",
        package_name=package_name,
        git=git,
        smoke_test=smoke_test,
        smoke_test_image=smoke_image,
    )


def toolkit(spec: Section) -> ToolkitSpec:
    sec = spec.section("nvidiaContainerToolkit")
    if sec is None:
        return ToolkitSpec()
    install = sec.boolean("install")
    source = sec.choice("source", ("package", "git", "latest"), "package")
    channel, version = "stable", ""
    pkg = sec.section("package")
    if pkg is not None:
        channel = pkg.choice("channel", ("stable", "experimental"), "stable")
        version = pkg.string("version", check=checks.check_package_version)
        pkg.finish()
    version = legacy(
        sec, "version", version, f"{sec.path_of('package')}.version", checks.check_package_version
    )
    git = git_source(sec, source, defaults.GIT_REPOS["toolkit"], defaults.LATEST_TRACK)
    enable_cdi = sec.boolean("enableCDI")
    sec.finish()
    return ToolkitSpec(
        install=install, source=source, channel=channel, version=version, git=git, enable_cdi=enable_cdi
    )
