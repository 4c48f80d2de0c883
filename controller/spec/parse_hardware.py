"""Reader for ``spec.hardware``: the hardware a node must have (tether's extension).

A node whose facts do not match is quarantined before any step runs and again before its
cluster join step (``tether.controller.hardware``).
"""

from __future__ import annotations

from tether.controller.spec.model import GpuExpectation, HardwareSpec
from tether.controller.spec.reader import Section

MAX_GPUS = 64
MAX_GPU_MEMORY_MIB = 16 * 1024 * 1024
MAX_CPUS = 1_000_000
MAX_MEMORY_GIB = 1024 * 1024
MAX_TEXT = 64
DIAGNOSTICS = ("short", "long")
ON_DRIFT = ("cordon",)


def _text(value: str) -> str:
    if len(value) > MAX_TEXT:
        return f"at most {MAX_TEXT} characters"
    if any(not c.isprintable() for c in value):
        return "printable characters only"
    return ""


def _quoted(sec: Section, name: str) -> str:
    """A text field that YAML must not read as a number: ``driverVersion: 570.`` is the float
    570.0, whose text "570.0" no driver version starts with."""
    raw = sec.raw(name)
    if raw is not None and not isinstance(raw, str):
        sec.problems.add(sec.path_of(name), f'must be a string: quote it, e.g. "{raw}"')
        sec.string(name)  # seen: not also an unknown field
        return ""
    return sec.string(name, check=_text).strip()


def _minimum(parent: Section, name: str, high: int) -> int:
    sec = parent.section(name)
    if sec is None:
        if parent.has(name):
            parent.problems.add(parent.path_of(name), "must be a mapping such as {min: 32}")
        return 0
    value = sec.integer("min", 0, low=1, high=high)
    if not sec.has("min"):
        sec.problems.add(sec.path_of("min"), "required")
    sec.finish()
    return value


def _gpus(parent: Section) -> GpuExpectation | None:
    sec = parent.section("gpus")
    if sec is None:
        if parent.has("gpus"):
            parent.problems.add(parent.path_of("gpus"), "must be a mapping (count, product, memoryMiB ...)")
        return None
    if not sec.has("count"):
        sec.problems.add(sec.path_of("count"), "required: exactly how many NVIDIA GPUs a node has")
    count = sec.integer("count", 0, low=0, high=MAX_GPUS)
    product = _quoted(sec, "product")
    memory = sec.integer("memoryMiB", 0, low=1, high=MAX_GPU_MEMORY_MIB)
    driver = _quoted(sec, "driverVersion")
    diagnostics = sec.string("diagnostics").strip()
    if diagnostics and diagnostics not in DIAGNOSTICS:
        sec.problems.add(sec.path_of("diagnostics"), f"must be short or long (got {diagnostics[:20]!r})")
        diagnostics = ""
    if count == 0 and (product or memory or driver or diagnostics):
        sec.problems.add(sec.path_of("count"), "product, memoryMiB, driverVersion and diagnostics need GPUs")
    sec.finish()
    return GpuExpectation(
        count=count, product=product, memory_mib=memory, driver_version=driver, diagnostics=diagnostics
    )


def hardware(spec: Section) -> HardwareSpec | None:
    sec = spec.section("hardware")
    if sec is None:
        if spec.has("hardware"):
            spec.problems.add(spec.path_of("hardware"), "must be a mapping (gpus, cpus, memoryGiB, onDrift)")
        return None
    gpus = _gpus(sec)
    on_drift = sec.string("onDrift").strip()
    if on_drift and on_drift not in ON_DRIFT:
        sec.problems.add(sec.path_of("onDrift"), f"must be cordon, or left out (got {on_drift[:20]!r})")
        on_drift = ""
    result = HardwareSpec(
        gpus=gpus,
        cpus_min=_minimum(sec, "cpus", MAX_CPUS),
        memory_gib_min=_minimum(sec, "memoryGiB", MAX_MEMORY_GIB),
        on_drift=on_drift,
    )
    sec.finish()
    return result
