"""Agent configuration: a YAML file (what systemd uses) overridden by flags.

What wins, first to last: a flag, the environment (``TETHER_JOIN_TOKEN``), the config file, and
for the controller addresses only, the address(es) the state directory remembers from enrolling
(``node.json``; replaced by the live replicas a Welcome lists, see ``tether.nodeagent.controllers``).

Several controller replicas: ``--controller A,B`` or ``controllers: [A, B]`` (``controller: A``,
one address, still works; given both, the file's ``controller`` comes first). A flag replaces
both settings of the file.

``load`` reports every problem at once. The join token may be given inline,
in a separate 0600 file (``token_file``), or by the environment variable
``TETHER_JOIN_TOKEN`` (what ``tetherctl token create --print-join-command``
prints: no secret on the agent's command line); it is only needed until the
node has enrolled.

Paths are made absolute here, at the edge: a relative one in a config file is
relative to that file's directory, one given as a flag to the working directory
(steps run elsewhere, and would not find a relative state directory).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether.nodeagent.controllers import merged, parse_addresses
from tether.nodeagent.errors import ConfigError
from tether.nodeagent.identity import IdentityStore, normalize_ca_hash, read_private
from tether.nodeagent.secrets import Secret

DEFAULT_CONFIG = Path("/etc/tether/agent.yaml")
DEFAULT_STATE_DIR = Path("/var/lib/tether")
TOKEN_ENV = "TETHER_JOIN_TOKEN"  # noqa: S105 (the name of the variable, not a token)
PATH_KEYS = ("state_dir", "token_file", "metrics_textfile")


@dataclass(frozen=True)
class AgentConfig:
    """``controller`` is the first of ``controllers`` (either may be given; the other follows)."""

    controller: str = ""
    state_dir: Path = DEFAULT_STATE_DIR
    node_name: str = ""
    ca_hash: str = ""
    token: Secret = field(default_factory=lambda: Secret(""))
    environment: str = ""  # optional: the token must be scoped to this environment
    role: str = ""  # optional: ... and this role
    heartbeat_seconds: float = 30.0
    backoff_max_seconds: float = 30.0
    reboot_command: tuple[str, ...] = ("systemctl", "reboot")
    log_level: str = "info"
    shell: str = "bash"
    metrics_textfile: Path | None = None  # node-exporter textfile collector file (tether.nodeagent.textfile)
    controllers: tuple[str, ...] = ()  # every replica to try, in order
    controllers_remembered: bool = False  # they came from the state directory, not the operator

    def __post_init__(self) -> None:
        addresses = merged((self.controller,) if self.controller else (), self.controllers)
        object.__setattr__(self, "controllers", addresses)
        object.__setattr__(self, "controller", addresses[0] if addresses else "")


KNOWN_KEYS = {
    "controller",
    "controllers",
    "state_dir",
    "node_name",
    "ca_hash",
    "token",
    "token_file",
    "environment",
    "role",
    "heartbeat_seconds",
    "backoff_max_seconds",
    "reboot_command",
    "log_level",
    "shell",
    "metrics_textfile",
}


def load(path: Path | None, overrides: Mapping[str, Any], env: Mapping[str, str]) -> AgentConfig:
    """Merge file < environment < flags (flags given as ``overrides``; None means unset).

    The controller address, when none of them names it, is the one the node last reached (kept in
    its state directory since enrolling): an enrolled agent needs only ``--state-dir``.
    """
    problems: list[str] = []
    values: dict[str, Any] = {}
    if path is not None:
        import yaml  # only for a config file: an agent run with flags alone never loads it

        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot read config: {exc}") from exc
        if not isinstance(doc, dict):
            raise ConfigError(f"{path}: expected a mapping of settings")
        if doc.get("token"):
            try:
                read_private(path)  # a file holding a join token must be 0600 and ours
            except Exception as exc:
                problems.append(f"{path}: holds a join token, so {exc}")
        for key in sorted(set(doc) - KNOWN_KEYS):
            problems.append(f"{path}: unknown setting {key!r}")
        values.update({k: v for k, v in doc.items() if k in KNOWN_KEYS})
        for key in PATH_KEYS:
            if values.get(key):
                values[key] = path.absolute().parent / Path(str(values[key]))
    if env.get(TOKEN_ENV):
        values["token"] = env[TOKEN_ENV]
    if overrides.get("controller") is not None:
        values.pop("controllers", None)  # the flag replaces both settings of the file
    values.update({k: v for k, v in overrides.items() if v is not None})
    for key in PATH_KEYS:
        if values.get(key):
            values[key] = Path(str(values[key])).absolute()

    token_value = str(values.pop("token", "") or "")
    token_file = values.pop("token_file", None)
    if token_file and not token_value:
        try:
            token_value = read_private(Path(token_file)).decode().strip()
        except FileNotFoundError:
            token_value = ""  # already enrolled nodes may have deleted it
        except OSError as exc:
            problems.append(f"token_file: {exc}")
        except Exception as exc:  # IdentityError: wrong mode or owner
            problems.append(f"token_file: {exc}")

    state_dir = Path(values.get("state_dir") or DEFAULT_STATE_DIR)
    controllers, remembered = _controllers(values, state_dir, problems)
    ca_hash = str(values.get("ca_hash", "") or "")
    if ca_hash:
        try:
            ca_hash = normalize_ca_hash(ca_hash)
        except Exception as exc:
            problems.append(f"ca_hash: {exc}")
    reboot = values.get("reboot_command", AgentConfig.reboot_command)
    if isinstance(reboot, str):
        reboot = tuple(reboot.split())
    numbers: dict[str, float] = {}
    for key in ("heartbeat_seconds", "backoff_max_seconds"):
        if key in values:
            try:
                numbers[key] = float(values[key])
                if numbers[key] <= 0:
                    raise ValueError
            except (TypeError, ValueError):
                problems.append(f"{key}: must be a positive number")
    if problems:
        raise ConfigError("invalid agent configuration:\n  " + "\n  ".join(problems))
    return AgentConfig(
        controller="",  # the first of controllers
        controllers=controllers,
        controllers_remembered=remembered,
        state_dir=state_dir,
        node_name=str(values.get("node_name") or ""),
        ca_hash=ca_hash,
        token=Secret(token_value),
        environment=str(values.get("environment") or ""),
        role=str(values.get("role") or ""),
        reboot_command=tuple(str(x) for x in reboot),
        log_level=str(values.get("log_level") or "info"),
        shell=str(values.get("shell") or "bash"),
        metrics_textfile=Path(values["metrics_textfile"]) if values.get("metrics_textfile") else None,
        **numbers,
    )


def _controllers(
    values: Mapping[str, Any], state_dir: Path, problems: list[str]
) -> tuple[tuple[str, ...], bool]:
    """The operator's addresses (``controller`` then ``controllers``), else the remembered ones;
    and whether they are the remembered ones. Each bad address is a problem of its own."""
    given: list[str] = []
    named = False
    for key in ("controller", "controllers"):
        addresses, bad = parse_addresses(values.get(key), key)
        given.extend(addresses)
        problems.extend(bad)
        named = named or bool(addresses or bad)
    if named:
        return merged(given), False
    remembered, bad = parse_addresses(
        list(IdentityStore(state_dir).controllers()), f"{state_dir / 'node.json'}"
    )
    problems.extend(bad)
    if not remembered and not bad:
        problems.append(
            "controller: required (HOST:PORT of the tether controller, or several: A,B; "
            f"an enrolled agent remembers them in {state_dir / 'node.json'})"
        )
    return remembered, True
