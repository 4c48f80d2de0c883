"""Readers for where software comes from (package repositories, download mirror) and for the
provider fields tether accepts and ignores."""

from __future__ import annotations

from collections.abc import Mapping

from tether.bootstrap import sshconfig
from tether.controller.spec import checks
from tether.controller.spec.model import PackageRepositories, PackageRepository
from tether.controller.spec.reader import Section

ADOPT = "ignored: tether adopts machines that exist"
BOOTSTRAP_ONLY = "read by `tetherctl bootstrap --inventory` only (the controller does not use it)"
PROVIDER_FIELDS = ("provider", "auth", "instance", "loadBalancer")


def provider_fields(spec: Section) -> None:
    """holodeck's cloud/provider fields: accepted, each one noted as ignored."""
    for name in PROVIDER_FIELDS:
        found = spec.lookup(name)
        if found is None:
            continue
        sub = (
            Section.of(found[1], spec.child(found[0]), spec.problems) if isinstance(found[1], dict) else None
        )
        if sub is None or not found[1]:
            spec.problems.note(spec.child(found[0]), ADOPT)
        else:
            if name == "auth":
                _auth(sub)
            elif name == "instance" and sub.has("hostUrl"):
                sub.string("hostUrl")
                sub.problems.note(sub.path_of("hostUrl"), BOOTSTRAP_ONLY)
            sub.ignore_rest(ADOPT)


def _auth(auth: Section) -> None:
    """``auth``: the login fields and ``sshConfig`` serve the bootstrap; their shape is checked here."""
    for name in ("username", "privateKey"):
        if auth.has(name):
            auth.string(name, check=sshconfig.check_user if name == "username" else sshconfig.check_path)
            auth.problems.note(auth.path_of(name), BOOTSTRAP_ONLY)
    found = auth.lookup("sshConfig")
    if found is None or found[1] is None:
        return
    path, raw = auth.child(found[0]), found[1]
    problems = auth.problems
    # The bootstrap's own reading (``tetherctl bootstrap --inventory``), so that a file
    # ``env validate`` calls valid is one the bootstrap takes, and the other way round.
    config, refused, unknown = sshconfig.parse(raw, path)
    for where, message in refused:
        problems.add(where, message)
    for where in unknown:
        problems.unknown(where)
    if not isinstance(raw, Mapping):
        return
    problems.note(path, BOOTSTRAP_ONLY)
    sec = Section(raw, path, problems)  # only for the paths of keys as written
    if config.agent_socket and not config.use_agent:
        problems.note(sec.path_of("agentSocket"), "ignored without useAgent: true")
    if config.known_hosts_policy == "accept-new":
        problems.note(
            sec.path_of("knownHostsPolicy"),
            "accept-new trusts an unknown host's key on first use and records it",
        )
    elif config.known_hosts_policy == "off":
        problems.note(
            sec.path_of("knownHostsPolicy"),
            "off verifies no host key: `tetherctl bootstrap` refuses it unless "
            "--insecure-ignore-host-key is given too",
        )


def download_mirror(spec: Section) -> str:
    mirror = spec.string("downloadMirror", check=lambda v: checks.check_url(v, https_only=False))
    return mirror.rstrip("/")


def _key(sec: Section) -> str:
    found = sec.lookup("key")
    if found is None or not found[1]:
        return ""
    value = found[1]
    path = sec.child(found[0])
    if not isinstance(value, str):
        sec.problems.add(path, "must be an https URL or an ASCII-armored PGP public key")
        return ""
    if value.startswith("-----BEGIN"):
        text = value if value.endswith("\n") else value + "\n"
        if not checks.ARMORED_KEY_RE.fullmatch(text):
            sec.problems.add(path, "not an ASCII-armored PGP public key block")
            return ""
        return text
    reason = checks.check_url(value)
    if reason:
        sec.problems.add(path, f"{reason} (or an ASCII-armored PGP public key)")
        return ""
    return value


def _repo(path: str, item: object, manager: str, spec: Section) -> PackageRepository | None:
    sec = Section.of(item, path, spec.problems)
    if sec is None:
        if item is None:
            spec.problems.add(path, "must be a mapping")
        return None
    url = sec.string("url", check=lambda v: checks.check_url(v, https_only=False), required=True)
    key = _key(sec)
    trusted = sec.boolean("trusted")
    if key and trusted:
        sec.problems.add(sec.path_of("trusted"), "give either key or trusted: true, not both")
    elif not key and not trusted:
        sec.problems.add(
            sec.path,
            "needs key (signing key URL or armored key) or trusted: true (no signature check)",
        )
    suite = ""
    components: tuple[str, ...] = ()
    if manager == "apt":
        suite = sec.string("suite", "./", check=checks.check_suite)
        comps: list[str] = []
        for cpath, comp in sec.items("components"):
            if not isinstance(comp, str) or not checks.COMPONENT_RE.fullmatch(comp):
                spec.problems.add(cpath, "not a repository component")
            else:
                comps.append(comp)
        components = tuple(comps)
        if suite == "./" and components:
            sec.problems.add(sec.path_of("components"), "a flat repository (suite ./) has no components")
        if suite != "./" and not components:
            sec.problems.add(sec.path_of("components"), "required with a suite (e.g. [main])")
    sec.finish()
    return PackageRepository(url=url, key=key, trusted=trusted, suite=suite, components=components)


def package_repositories(spec: Section) -> PackageRepositories:
    sec = spec.section("packageRepositories")
    if sec is None:
        return PackageRepositories()
    found: dict[str, list[PackageRepository]] = {"apt": [], "dnf": []}
    for manager, repos in found.items():
        for path, item in sec.items(manager):
            repo = _repo(path, item, manager, sec)
            if repo is not None:
                repos.append(repo)
    sec.finish()
    return PackageRepositories(apt=tuple(found["apt"]), dnf=tuple(found["dnf"]))
