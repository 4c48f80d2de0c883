"""Does a node have the hardware ``spec.hardware`` asks for? Pure: facts in, a verdict out.

Two stages. ``before-steps`` looks at what can be seen without a driver: the NVIDIA GPUs on the
PCI bus (or nvidia-smi's list when a driver is already loaded, with their memory), their product
names, CPUs and memory. ``before-join`` looks at everything and needs the driver: nvidia-smi's
count, product names, memory per GPU and driver version.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tether.controller.hardware.names import CHECK_STEP, DIAGNOSTICS_STEP, VERIFY_STEP
from tether.controller.spec.model import GpuExpectation, HardwareSpec
from tether.nodeagent.model import HostFacts

BEFORE_STEPS = "before-steps"
BEFORE_JOIN = "before-join"
DIAGNOSTICS = "diagnostics"
STAGES = {CHECK_STEP: BEFORE_STEPS, VERIFY_STEP: BEFORE_JOIN, DIAGNOSTICS_STEP: DIAGNOSTICS}
GIB = 1024**3
# /proc/meminfo's MemTotal is below the installed memory (the kernel keeps some): a node with
# 256 GiB installed reports about 251 GiB. Within this share of the minimum it still counts.
MEMORY_SLACK = 0.04


@dataclass(frozen=True)
class Verdict:
    """What was expected and found, by key (``gpus.count`` ...), and one line per mismatch."""

    stage: str
    expected: dict[str, str] = field(default_factory=dict)
    found: dict[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return "; ".join(self.problems) if self.problems else "matches spec.hardware"


class _Check:
    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.expected: dict[str, str] = {}
        self.found: dict[str, str] = {}
        self.problems: list[str] = []

    def see(self, key: str, expected: str, found: str, ok: bool) -> None:
        self.expected[key] = expected
        self.found[key] = found
        if not ok:
            self.problems.append(f"{key}: expected {expected}, found {found}")

    def verdict(self) -> Verdict:
        return Verdict(self.stage, self.expected, self.found, tuple(self.problems))


def check(spec: HardwareSpec, facts: HostFacts, stage: str, *, driver: bool = True) -> Verdict:
    """``facts`` against ``spec`` at ``stage`` (``BEFORE_STEPS`` or ``BEFORE_JOIN``).

    ``driver``: a driver is expected on the node by the join (the spec installs one, or names a
    ``driverVersion``). Without one (the GPU operator brings it later, in a container) nvidia-smi
    may list nothing before the join, and the PCI bus is what counts then too."""
    c = _Check(stage)
    if spec.gpus is not None:
        with_driver = stage == BEFORE_JOIN and (driver or bool(spec.gpus.driver_version))
        if facts.gpus or with_driver:
            _driver_view(c, spec.gpus, facts, with_driver=with_driver)
        else:
            _bus_view(c, spec.gpus, facts)
    if spec.cpus_min:
        c.see("cpus.min", f"at least {spec.cpus_min}", str(facts.cpu_count), facts.cpu_count >= spec.cpus_min)
    if spec.memory_gib_min:
        have = facts.memory_total_bytes / GIB
        ok = have >= spec.memory_gib_min * (1 - MEMORY_SLACK)
        c.see("memoryGiB.min", f"at least {spec.memory_gib_min} GiB", f"{have:.1f} GiB", ok)
    return c.verdict()


def _bus_view(c: _Check, want: GpuExpectation, facts: HostFacts) -> None:
    """No driver yet: the PCI bus says how many NVIDIA GPUs there are and (pci.ids) what they are."""
    on_bus = facts.pci_gpus
    c.see("gpus.count", str(want.count), f"{len(on_bus)} on the PCI bus", len(on_bus) == want.count)
    if want.product and on_bus:
        names = [g.name or f"device {g.device_id}" for g in on_bus]
        unnamed = [g for g in on_bus if not g.name]
        if unnamed:
            # Without a PCI name (no pci.ids) the product is checked before the join, with the driver.
            c.expected["gpus.product"] = f"*{want.product}*"
            c.found["gpus.product"] = f"{', '.join(sorted(set(names)))} (checked again with the driver)"
        else:
            wrong = sorted({n for n in names if want.product.lower() not in n.lower()})
            c.see("gpus.product", f"*{want.product}*", ", ".join(sorted(set(names))), not wrong)


def _driver_view(c: _Check, want: GpuExpectation, facts: HostFacts, *, with_driver: bool) -> None:
    """nvidia-smi's view: count, product, memory per GPU, and (before the join) the driver."""
    gpus = facts.gpus
    found = f"{len(gpus)} (nvidia-smi)" if gpus else "0 (nvidia-smi lists none: no driver?)"
    c.see("gpus.count", str(want.count), found, len(gpus) == want.count)
    if want.product and gpus:
        names = sorted({g.name for g in gpus})
        ok = all(want.product.lower() in g.name.lower() for g in gpus)
        c.see("gpus.product", f"*{want.product}*", ", ".join(names), ok)
    if want.memory_mib and gpus:
        least = min(g.memory_total_mib for g in gpus)
        c.see(
            "gpus.memoryMiB",
            f"at least {want.memory_mib} per GPU",
            f"{least} (smallest)",
            least >= want.memory_mib,
        )
    if want.driver_version and with_driver:
        versions = sorted({g.driver_version for g in gpus}) or ["none"]
        ok = bool(gpus) and all(g.driver_version.startswith(want.driver_version) for g in gpus)
        c.see("gpus.driverVersion", f"{want.driver_version}*", ", ".join(versions), ok)
