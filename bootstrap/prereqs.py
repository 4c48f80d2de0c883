"""Prerequisites: a Python >= 3.10 (grpcio's floor), from the distribution when the default is older.

``plan`` decides without touching the machine (detection shows the plan before anything
changes); ``ensure`` carries it out and returns the interpreter the agent will use.
"""

from __future__ import annotations

from dataclasses import dataclass

from tether.bootstrap.detect import DetectedHost, Python, detect
from tether.bootstrap.errors import UnsupportedHost
from tether.bootstrap.layout import Layout
from tether.bootstrap.transport import Transport

# (os_id, major version) -> the distro package of a newer Python. Only distributions whose
# own repositories carry one; nothing is fetched from third-party repositories.
DISTRO_PYTHON: dict[tuple[str, str], str] = {
    ("rocky", "8"): "python3.11",
    ("rocky", "9"): "python3.11",
    ("almalinux", "8"): "python3.11",
    ("almalinux", "9"): "python3.11",
    ("rhel", "8"): "python3.11",
    ("rhel", "9"): "python3.11",
    ("centos", "9"): "python3.11",
    ("ol", "8"): "python3.11",
    ("ol", "9"): "python3.11",
    ("amzn", "2023"): "python3.11",
}
INSTALL_COMMAND = {
    "dnf": "dnf install -y -q {pkg}",
    "yum": "yum install -y -q {pkg}",
    "apt-get": "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends {pkg}",
}


@dataclass(frozen=True)
class PythonPlan:
    python: Python | None  # already there
    package: str = ""  # to install, when python is None
    command: str = ""
    reason: str = ""  # why nothing can be done, when both are empty

    @property
    def possible(self) -> bool:
        return self.python is not None or bool(self.command)

    def describe(self) -> str:
        if self.python is not None:
            return f"{self.python} is there"
        if self.command:
            return f"will install {self.package} from the distribution's repositories"
        return self.reason


def plan(host: DetectedHost) -> PythonPlan:
    if host.python is not None:
        return PythonPlan(host.python)
    facts = host.facts
    major = facts.os_version_id.split(".")[0]
    package = DISTRO_PYTHON.get((facts.os_id, major), "")
    if not package and facts.os_id == "fedora":
        package = "python3"
    found = ", ".join(str(p) for p in host.pythons) or "none"
    name = facts.os_pretty or f"{facts.os_id} {facts.os_version_id}".strip() or "this distribution"
    if not package:
        return PythonPlan(
            None, reason=f"{name} has no Python >= 3.10 (found: {found}) and no distro package of one"
        )
    template = INSTALL_COMMAND.get(host.package_manager)
    if template is None:
        return PythonPlan(None, reason=f"{name}: no package manager to install {package} with")
    return PythonPlan(None, package, template.format(pkg=package))


async def ensure(transport: Transport, host: DetectedHost, layout: Layout) -> tuple[Python, bool]:
    """The interpreter to use, installing it first when needed; True when something was installed."""
    chosen = plan(host)
    if chosen.python is not None:
        return chosen.python, False
    if not chosen.command:
        raise UnsupportedHost([chosen.reason], target=transport.target)
    await transport.check(f"installing {chosen.package}", chosen.command, timeout=900)
    again = await detect(transport, layout)
    if again.python is None:
        raise UnsupportedHost(
            [f"{chosen.package} was installed but no Python >= 3.10 runs"], target=transport.target
        )
    return again.python, True
