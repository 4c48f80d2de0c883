"""spec.hardware: what a node must have, validated with every problem's path."""

from __future__ import annotations

import pytest

from tether.controller.spec import SpecError, load_document
from tether.controller.spec.model import GpuExpectation, HardwareSpec

HEAD = "apiVersion: tether.dev/v1alpha1\nkind: Environment\nmetadata: {name: gpus}\nspec:\n"


def load(body: str) -> HardwareSpec | None:
    return load_document(HEAD + body).spec.hardware


def problems(body: str) -> list[str]:
    with pytest.raises(SpecError) as err:
        load_document(HEAD + body)
    return [str(p) for p in err.value.problems]


def test_the_issue_example_loads() -> None:
    spec = load(
        "  hardware:\n"
        "    gpus: {count: 8, product: H200, memoryMiB: 140000, driverVersion: '570.', diagnostics: short}\n"
        "    cpus: {min: 32}\n"
        "    memoryGiB: {min: 256}\n"
    )
    assert spec == HardwareSpec(
        gpus=GpuExpectation(
            count=8, product="H200", memory_mib=140000, driver_version="570.", diagnostics="short"
        ),
        cpus_min=32,
        memory_gib_min=256,
    )


def test_no_hardware_section_means_no_gate() -> None:
    assert load("  kubernetes: {install: false}\n") is None


def test_every_problem_has_its_path() -> None:
    got = problems(
        "  hardware:\n"
        "    gpus: {product: H200, diagnostics: extended, speed: fast}\n"
        "    cpus: {minimum: 4}\n"
        "    memoryGiB: 12\n"
        "    onDrift: reboot\n"
    )
    text = "\n".join(got)
    assert "spec.hardware.gpus.count: required" in text
    assert "spec.hardware.gpus.diagnostics: must be short or long" in text
    assert "spec.hardware.gpus.speed: unknown field" in text
    assert "spec.hardware.cpus.min: required" in text
    assert "spec.hardware.cpus.minimum: unknown field" in text
    assert "spec.hardware.memoryGiB: must be a mapping" in text
    assert "spec.hardware.onDrift: must be cordon" in text


def test_gpu_details_need_gpus_and_cordon_needs_a_cluster() -> None:
    text = "\n".join(problems("  hardware:\n    gpus: {count: 0, product: H200}\n    onDrift: cordon\n"))
    assert "spec.hardware.gpus.count: product, memoryMiB, driverVersion and diagnostics need GPUs" in text
    assert "spec.hardware.onDrift: cordon needs a kubeadm cluster" in text


def test_counts_are_bounded() -> None:
    text = "\n".join(problems("  hardware:\n    gpus: {count: 65, memoryMiB: -1}\n"))
    assert "spec.hardware.gpus.count: must be a whole number from 0 to 64" in text
    assert "spec.hardware.gpus.memoryMiB: must be a whole number" in text


def test_a_driver_version_yaml_reads_as_a_number_must_be_quoted() -> None:
    text = "\n".join(problems("  hardware:\n    gpus: {count: 2, driverVersion: 570., product: 200}\n"))
    assert 'spec.hardware.gpus.driverVersion: must be a string: quote it, e.g. "570.0"' in text
    assert 'spec.hardware.gpus.product: must be a string: quote it, e.g. "200"' in text
