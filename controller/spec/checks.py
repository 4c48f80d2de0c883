"""Validators for every value that can reach a shell script or a config file on a node.

Each ``check_*`` returns ``""`` when the value is acceptable, else a short reason. The patterns
are deliberately narrow: they admit what real versions, refs, URLs and labels look like and
nothing that a shell, a YAML file or an apt/dnf source line would interpret. Every pattern is
applied with ``fullmatch``: ``re.match`` with ``$`` also admits a trailing newline.
"""

from __future__ import annotations

import re

PACKAGE_VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+~:_-]{0,63}$")
SEMVER_RE = re.compile(r"^v?([0-9]{1,9})\.([0-9]{1,9})\.([0-9]{1,9})(-[0-9A-Za-z.-]{1,40})?$")
MINOR_RE = re.compile(r"^v?([0-9]{1,9})\.([0-9]{1,9})$")
KERNEL_RE = re.compile(r"^[0-9][0-9A-Za-z._+~-]{0,99}$")
BRANCH_RE = re.compile(r"^[0-9]{3}$")
GIT_REF_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
SHA256_RE = re.compile(r"^(?:sha256:)?([0-9a-fA-F]{64})$")
HOST_RE = re.compile(
    r"^(?=.{1,253}\Z)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
URL_RE = re.compile(
    r"^(?P<scheme>https?)://(?P<host>[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::(?P<port>[0-9]{1,5}))?"
    r"(?P<path>/[A-Za-z0-9._~/%+=:@,-]*)?$"
)
GITHUB_SHORT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
LABEL_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
LABEL_PREFIX_RE = re.compile(
    r"^(?=.{1,253}\Z)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)
FEATURE_GATE_RE = re.compile(r"^([A-Za-z][A-Za-z0-9]{0,99})=(true|false)$")
PACKAGE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9+._-]{0,99}$")
LOCAL_PATH_RE = re.compile(r"^[A-Za-z0-9._/-]{1,4096}$")
# [registry[:port]/]name[/name...][:tag][@sha256:digest], as docker and crictl accept them.
IMAGE_REF_RE = re.compile(
    r"^(?=.{1,255}\Z)(?:[A-Za-z0-9][A-Za-z0-9.-]*(?::[0-9]{1,5})?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)
SUITE_RE = re.compile(r"^(\./|[A-Za-z0-9][A-Za-z0-9._/-]{0,99})$")
COMPONENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ARMORED_KEY_RE = re.compile(
    r"^-----BEGIN PGP PUBLIC KEY BLOCK-----\n([A-Za-z0-9+/=: .\-]*\n)*-----END PGP PUBLIC KEY BLOCK-----\n?$"
)

# Environment names a template may not set: they change how bash or the loader behaves, or
# belong to the agent's own contract with the step.
RESERVED_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "IFS",
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PS4",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
    }
)
RESERVED_ENV_PREFIXES = ("TETHER_", "BASH_FUNC_")


def check_package_version(value: str) -> str:
    if PACKAGE_VERSION_RE.fullmatch(value):
        return ""
    return "not a package version (letters, digits and . + ~ : _ -)"


def check_semver(value: str) -> str:
    return "" if SEMVER_RE.fullmatch(value) else "not a version like v1.31.0"


def check_minor_or_semver(value: str) -> str:
    if SEMVER_RE.fullmatch(value) or MINOR_RE.fullmatch(value):
        return ""
    return "not a version like v1.33 or v1.33.2"


def check_kernel(value: str) -> str:
    return "" if KERNEL_RE.fullmatch(value) else "not a kernel version like 6.8.0-1015-aws"


def check_branch(value: str) -> str:
    return "" if BRANCH_RE.fullmatch(value) else "not a driver branch (three digits, e.g. 580)"


def check_git_ref(value: str) -> str:
    if not GIT_REF_RE.fullmatch(value):
        return "not a git ref (letters, digits and . _ / -)"
    if ".." in value or "//" in value or value.endswith(("/", ".lock", ".")) or "/." in value:
        return "not a valid git ref"
    return ""


def normalize_sha256(value: str) -> str | None:
    m = SHA256_RE.fullmatch(value)
    return m.group(1).lower() if m else None


def check_sha256(value: str) -> str:
    return "" if normalize_sha256(value) else "must be sha256:<64 hex digits>"


def check_url(value: str, *, https_only: bool = True) -> str:
    m = URL_RE.fullmatch(value)
    if not m:
        return "not a plain http(s) URL (no spaces, quotes, query strings or shell characters)"
    if https_only and m.group("scheme") != "https":
        return "must be an https:// URL"
    port = m.group("port")
    if port is not None and not 0 < int(port) < 65536:
        return "port out of range"
    if m.group("host").startswith("[") is False and not HOST_RE.fullmatch(m.group("host")):
        return "not a valid host name"
    return ""


def normalize_git_repo(value: str) -> str:
    """``owner/name`` (holodeck's GitHub shorthand) becomes an https URL; URLs stay as they are."""
    if GITHUB_SHORT_RE.fullmatch(value) and "://" not in value:
        return f"https://github.com/{value}.git"
    return value


def check_host(value: str) -> str:
    return "" if HOST_RE.fullmatch(value) else "not a host name or IPv4 address"


def check_env_name(value: str) -> str:
    if not ENV_NAME_RE.fullmatch(value):
        return "not a valid environment variable name"
    if value in RESERVED_ENV or value.startswith(RESERVED_ENV_PREFIXES):
        return "reserved name (it changes how the step's shell or the agent behaves)"
    return ""


def check_env_value(value: str) -> str:
    if "\x00" in value:
        return "must not contain NUL"
    if len(value) > 32768:
        return "longer than 32768 characters"
    return ""


def check_label_key(value: str) -> str:
    prefix, sep, name = value.rpartition("/")
    if sep and not LABEL_PREFIX_RE.fullmatch(prefix):
        return "label key prefix must be a DNS subdomain"
    if not LABEL_NAME_RE.fullmatch(name):
        return "not a Kubernetes label key"
    return ""


def check_label_value(value: str) -> str:
    return "" if value == "" or LABEL_NAME_RE.fullmatch(value) else "not a Kubernetes label value"


def check_feature_gate(value: str) -> str:
    return "" if FEATURE_GATE_RE.fullmatch(value) else "must look like FeatureName=true or FeatureName=false"


def check_package_name(value: str) -> str:
    return "" if PACKAGE_NAME_RE.fullmatch(value) else "not a package name"


def check_suite(value: str) -> str:
    return "" if SUITE_RE.fullmatch(value) else "not a suite"


def check_image_ref(value: str) -> str:
    return "" if IMAGE_REF_RE.fullmatch(value) else "not a container image reference"


def check_local_path(value: str) -> str:
    if not LOCAL_PATH_RE.fullmatch(value):
        return "path may contain only letters, digits and . _ / -"
    if ".." in value.split("/"):
        return "path must not contain '..'"
    return ""


def check_relative_path(value: str) -> str:
    """A local path relative to the working directory: ``check_local_path``, no leading ``/`` or ``~``."""
    if value.startswith(("/", "~")):
        return "must be relative to the working directory (no leading / or ~)"
    return check_local_path(value)
