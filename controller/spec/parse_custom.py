"""Reader for ``spec.customTemplates``: user scripts at five phases from three sources."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from tether.controller.spec import checks
from tether.controller.spec.model import PHASES, ROLES, CustomTemplate
from tether.controller.spec.reader import Section

NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
MAX_TIMEOUT = 24 * 3600
MAX_SCRIPT = 1 << 20


def custom_templates(spec: Section) -> tuple[CustomTemplate, ...]:
    out: list[CustomTemplate] = []
    seen: set[str] = set()
    for i, (path, item) in enumerate(spec.items("customTemplates")):
        sec = Section.of(item, path, spec.problems)
        if sec is None:
            if item is None:
                spec.problems.add(path, "must be a mapping")
            continue
        template = _one(sec, i)
        if template.name in seen:
            spec.problems.add(sec.path_of("name"), f"duplicate template name {template.name!r}")
        seen.add(template.name)
        out.append(template)
    return tuple(out)


def _one(sec: Section, index: int) -> CustomTemplate:
    name = sec.string("name", f"template-{index}", required=True)
    if not NAME_RE.fullmatch(name):
        sec.problems.add(sec.path_of("name"), "lowercase letters, digits and '-', at most 63 characters")
        name = f"template-{index}"
    phase = sec.choice("phase", PHASES, "post-install")
    inline = _text(sec, "inline")
    url = sec.string("url", check=checks.check_url)
    checksum = sec.string("checksum", check=checks.check_sha256)
    sha = checks.normalize_sha256(checksum) or ""
    if sec.has("file"):
        path = sec.string("file", check=checks.check_local_path)
        if path:
            sec.problems.add(
                sec.path_of("file"),
                "a file on the operator's machine: apply it with tetherctl, which inlines it",
            )
    given = [k for k, v in (("inline", inline), ("url", url)) if v] + (["file"] if sec.has("file") else [])
    if len(given) != 1:
        sec.problems.add(sec.path, "exactly one of inline, file or url is required")
    if url and not sha:
        sec.problems.add(sec.path_of("checksum"), "required with url (sha256:<64 hex digits>)")
    if inline and sha and hashlib.sha256(inline.encode()).hexdigest() != sha:
        sec.problems.add(sec.path_of("checksum"), "does not match the script text")
    env = sec.string_map("env", key_check=checks.check_env_name, value_check=checks.check_env_value)
    timeout = sec.integer("timeout", 600, low=1, high=MAX_TIMEOUT)
    coe = sec.boolean("continueOnError")
    roles = _roles(sec)
    sec.finish()
    return CustomTemplate(
        name=name,
        phase=phase,
        inline=inline,
        url=url,
        sha256=sha,
        env=env,
        continue_on_error=coe,
        timeout_seconds=timeout,
        roles=roles,
    )


def _text(sec: Section, name: str) -> str:
    found = sec.lookup(name)
    if found is None or found[1] is None:
        return ""
    value: Any = found[1]
    path = sec.child(found[0])
    if not isinstance(value, str) or not value.strip():
        sec.problems.add(path, "must be the script text")
        return ""
    if "\x00" in value or len(value) > MAX_SCRIPT:
        sec.problems.add(path, f"must be text without NUL, at most {MAX_SCRIPT} bytes")
        return ""
    return value


def _roles(sec: Section) -> tuple[str, ...]:
    items = sec.items("roles")
    if not items and not sec.has("roles"):
        return ROLES
    roles: list[str] = []
    for path, role in items:
        if role not in ROLES:
            sec.problems.add(path, f"must be one of {', '.join(ROLES)}")
        elif role not in roles:
            roles.append(role)
    if not roles:
        sec.problems.add(sec.path_of("roles"), "must name at least one role")
        return ROLES
    return tuple(roles)
