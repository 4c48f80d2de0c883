"""The hardware verdict: facts against spec.hardware, before any step and before the join."""

from __future__ import annotations

from tether.controller.hardware.expect import BEFORE_JOIN, BEFORE_STEPS, GIB, check
from tether.controller.spec.model import GpuExpectation, HardwareSpec
from tether.nodeagent.model import Gpu, HostFacts, PciGpu

H200 = "NVIDIA H200"
SPEC = HardwareSpec(
    gpus=GpuExpectation(count=2, product="H200", memory_mib=140000, driver_version="570."),
    cpus_min=32,
    memory_gib_min=256,
)


def bus(n: int, name: str = "GH100 [H200 SXM 141GB]") -> tuple[PciGpu, ...]:
    return tuple(PciGpu(f"0000:{i:02x}:00.0", "0x2335", name) for i in range(n))


def smi(n: int, name: str = H200, memory: int = 143771, driver: str = "570.124.06") -> tuple[Gpu, ...]:
    return tuple(Gpu(i, name, f"GPU-{i}", driver, memory, f"00000000:{i:02X}:00.0") for i in range(n))


def facts(**kw: object) -> HostFacts:
    base: dict[str, object] = {"cpu_count": 64, "memory_total_bytes": 251 * GIB}
    return HostFacts(**{**base, **kw})  # type: ignore[arg-type]


def test_before_any_step_the_pci_bus_counts_without_a_driver() -> None:
    v = check(SPEC, facts(pci_gpus=bus(2)), BEFORE_STEPS)
    assert v.ok, v.problems
    assert v.found["gpus.count"] == "2 on the PCI bus"
    assert "gpus.driverVersion" not in v.expected  # checked after the driver step


def test_a_missing_gpu_and_a_wrong_product_are_named() -> None:
    v = check(SPEC, facts(pci_gpus=bus(1, "GA100 [A100 SXM4 80GB]")), BEFORE_STEPS)
    assert not v.ok
    assert "gpus.count: expected 2, found 1 on the PCI bus" in v.problems
    assert "gpus.product: expected *H200*, found GA100 [A100 SXM4 80GB]" in v.problems


def test_no_gpu_at_all_is_a_mismatch() -> None:
    v = check(HardwareSpec(gpus=GpuExpectation(count=8)), facts(), BEFORE_STEPS)
    assert v.problems == ("gpus.count: expected 8, found 0 on the PCI bus",)
    assert v.expected == {"gpus.count": "8"} and v.found == {"gpus.count": "0 on the PCI bus"}


def test_unnamed_pci_devices_leave_the_product_to_the_driver_check() -> None:
    v = check(SPEC, facts(pci_gpus=bus(2, "")), BEFORE_STEPS)
    assert v.ok
    assert "checked again with the driver" in v.found["gpus.product"]


def test_with_a_driver_already_there_memory_is_checked_before_any_step() -> None:
    v = check(SPEC, facts(gpus=smi(2, memory=81559)), BEFORE_STEPS)
    assert v.problems == ("gpus.memoryMiB: expected at least 140000 per GPU, found 81559 (smallest)",)


def test_before_the_join_the_driver_version_is_a_prefix() -> None:
    assert check(SPEC, facts(gpus=smi(2)), BEFORE_JOIN).ok
    v = check(SPEC, facts(gpus=smi(2, driver="550.54.15")), BEFORE_JOIN)
    assert v.problems == ("gpus.driverVersion: expected 570.*, found 550.54.15",)


def test_before_the_join_no_nvidia_smi_is_a_mismatch_even_with_gpus_on_the_bus() -> None:
    v = check(SPEC, facts(pci_gpus=bus(2)), BEFORE_JOIN)
    assert "gpus.count: expected 2, found 0 (nvidia-smi lists none: no driver?)" in v.problems
    assert "gpus.driverVersion: expected 570.*, found none" in v.problems


def test_cpus_and_memory_minimums() -> None:
    v = check(SPEC, facts(pci_gpus=bus(2), cpu_count=16, memory_total_bytes=128 * GIB), BEFORE_STEPS)
    assert "cpus.min: expected at least 32, found 16" in v.problems
    assert "memoryGiB.min: expected at least 256 GiB, found 128.0 GiB" in v.problems
    # MemTotal is a little below the installed memory: 251 GiB reported for 256 installed counts.
    assert check(HardwareSpec(memory_gib_min=256), facts(), BEFORE_STEPS).ok
