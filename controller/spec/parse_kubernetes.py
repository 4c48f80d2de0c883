"""Reader for ``spec.kubernetes`` (holodeck's capitalized keys and tether's spellings alike)."""

from __future__ import annotations

from tether.controller.spec import checks, defaults, kubeadm_template
from tether.controller.spec.model import INSTALLERS, KubernetesSpec
from tether.controller.spec.parse_components import git_source, legacy
from tether.controller.spec.reader import Section


def _v(version: str) -> str:
    return version if not version or version.startswith("v") else f"v{version}"


def _config(sec: Section, name: str) -> str:
    """A user config: ``<name>Content`` (inlined by tetherctl) or a path the controller cannot read."""
    content = sec.string(f"{name}Content")
    if sec.has(name):
        path = sec.string(name, check=checks.check_local_path)
        if path and not content:
            sec.problems.add(
                sec.path_of(name),
                "a file on the operator's machine: apply it with tetherctl, which inlines it "
                f"(as {name}Content)",
            )
    if name == "kubeAdmConfig":  # holodeck runs it as a Go template: its four placeholders only
        reason = kubeadm_template.check(content)
        if reason:
            sec.problems.add(sec.path_of(f"{name}Content"), reason)
            return ""
    elif "{{" in content:
        sec.problems.add(
            sec.path_of(f"{name}Content"),
            "holodeck does not expand Go templates in this file, and neither does tether: write the "
            "values in",
        )
        return ""
    return content


def _version(sec: Section, source: str) -> str:
    """``release.version``, or its deprecated alias ``Version``, or tether's default."""
    version = ""
    rel = sec.section("release")
    if rel is not None:
        version = rel.string("version", check=checks.check_semver)
        rel.finish()
    version = _v(version)
    old = sec.string("Version", check=checks.check_semver) if sec.has("Version") else ""
    if old:
        sec.problems.note(sec.path_of("Version"), "deprecated alias of release.version; still accepted")
        if version and _v(old) != version:
            sec.problems.add(
                sec.path_of("Version"), f"conflicts with release.version ({old!r} != {version!r})"
            )
        version = version or _v(old)
    if not version:
        version = defaults.KUBERNETES_VERSION
    m = checks.SEMVER_RE.fullmatch(version)
    if m and source == "release" and (int(m.group(1)), int(m.group(2))) < (1, 24):
        sec.problems.add(
            f"{sec.path_of('release')}.version", "releases before v1.24 are not served by pkgs.k8s.io"
        )
    return version


def _kubeconfig_fields(sec: Section, installer: str) -> tuple[str, bool]:
    """holodeck's ``kubeConfig`` (where tetherctl writes the kubeconfig, relative to its working
    directory: never absolute or ``~``) and ``remoteAccess``; notes with another installer."""
    kube_config = sec.string("kubeConfig", check=checks.check_relative_path)
    remote_access = sec.boolean("remoteAccess")
    if installer != "kubeadm":
        for name in ("kubeConfig", "remoteAccess"):
            if sec.has(name):
                sec.problems.note(
                    sec.path_of(name), "ignored: only kubeadm clusters export a kubeconfig (tetherctl)"
                )
    return kube_config, remote_access


def kubernetes(spec: Section) -> KubernetesSpec:
    sec = spec.section("kubernetes")
    if sec is None:
        return KubernetesSpec()
    install = sec.boolean("install")
    installer = sec.choice("Installer", INSTALLERS, "kubeadm")
    source = sec.choice("source", ("release", "git", "latest"), "release")
    version = _version(sec, source)
    track = defaults.LATEST_TRACKS["kubernetes"]
    git = git_source(sec, source, defaults.GIT_REPOS["kubernetes"], track)
    gates: list[str] = []
    for path, item in sec.items("K8sFeatureGates"):
        reason = checks.check_feature_gate(item) if isinstance(item, str) else "must be a string"
        if reason:
            sec.problems.add(path, reason)
        else:
            gates.append(item)
    sec.ignore("Features", "ignored: holodeck never used this field")
    sec.ignore("KubeletReleaseVersion", "ignored: tether installs the kubelet unit itself")
    kube_config, remote_access = _kubeconfig_fields(sec, installer)
    arch = sec.string("Arch")
    if arch and arch not in ("amd64", "arm64"):
        sec.problems.add(sec.path_of("Arch"), "must be amd64 or arm64")
        arch = ""
    result = KubernetesSpec(
        install=install,
        installer=installer,
        source=source,
        version=version,
        git=git,
        feature_gates=tuple(gates),
        arch=arch,
        cni_plugins_version=_v(sec.string("CniPluginsVersion", check=checks.check_semver)),
        crictl_version=_v(sec.string("CrictlVersion", check=checks.check_semver)),
        calico_version=_v(sec.string("CalicoVersion", check=checks.check_semver)),
        kind_version=_v(sec.string("kindVersion", check=checks.check_semver)),
        endpoint_host=sec.string("K8sEndpointHost", check=checks.check_host),
        kubeadm_config=_config(sec, "kubeAdmConfig"),
        kind_config=_config(sec, "kindConfig"),
        remote_access=remote_access,
        kube_config=kube_config,
    )
    sec.finish()
    return result


__all__ = ["kubernetes", "legacy"]
