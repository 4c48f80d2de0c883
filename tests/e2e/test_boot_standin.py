"""The boot-chain stand-in (TEST FIXTURE, testbed/standins/boot_standin.py) against tether's kernel step.

Not e2e: the stand-in runs on the host under a temporary root (``TETHER_BOOT_STANDIN_ROOT``), and the
grub.cfg it writes is read by the two awk programs of the rendered kernel step itself, so a change on
either side (the stand-in's grub.cfg layout or what kernel.j2 looks for) fails here, not as a failed
step on a node (test_kernel_reboot.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.testbed import kernelpkgs
from tether.controller.render import NodeContext, render
from tether.controller.render.targets import facts_for
from tether.controller.spec import load_document

KERNEL = kernelpkgs.KERNEL
OTHER = (
    "6.8.0-50-generic"  # newer than the pin: grub's first entry boots it unless the default says otherwise
)


def standin(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(kernelpkgs.BOOT_STANDIN), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TETHER_BOOT_STANDIN_ROOT": str(root)},
        timeout=30,
        check=True,
    )


def booted(root: Path) -> str:
    """Boot (the stand-in's boot loader); the kernel ``uname -r`` says in that boot, "" for the host's."""
    standin(root, "boot")
    release = root / kernelpkgs.RELEASE_FILE.lstrip("/")
    return release.read_text().strip() if release.exists() else ""


def kernel_step_awk() -> str:
    """The lines of the rendered kernel step that find the submenu and the entry in grub.cfg."""
    doc = f"""\
apiVersion: tether.dev/v1alpha1
kind: Environment
metadata: {{name: k}}
spec:
  kernel: {{version: {KERNEL}}}
"""
    plan = render(load_document(doc).spec, NodeContext("worker", facts_for("debian-12")))
    script = next(s.script for s in plan.steps if s.name == "kernel")
    lines = [line for line in script.splitlines() if re.match(r"^(submenu|entry)=\$\(awk ", line)]
    assert len(lines) == 2, script[-2000:]
    return "\n".join(lines)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for version in (OTHER, KERNEL):
        (tmp_path / f"boot/vmlinuz-{version}").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f"boot/vmlinuz-{version}").write_text("TEST FIXTURE\n")
        (tmp_path / f"lib/modules/{version}").mkdir(parents=True)
    (tmp_path / "etc/default/grub.d").mkdir(parents=True)
    (tmp_path / "etc/default/grub").write_text(kernelpkgs.GRUB_DEFAULTS)
    return tmp_path


def test_the_kernel_steps_default_entry_is_what_the_next_boot_runs(root: Path) -> None:
    standin(root, "update-initramfs", "-c", "-k", KERNEL)
    assert (root / f"boot/initrd.img-{KERNEL}").exists()
    standin(root, "update-grub")
    assert booted(root) == OTHER  # GRUB_DEFAULT=0: the first entry, the newest kernel

    # What kernel.j2 does next, with its own awk programs, on the stand-in's grub.cfg.
    cfg = root / "boot/grub/grub.cfg"
    found = subprocess.run(
        ["bash", "-c", f'{kernel_step_awk()}\nprintf "%s\\n" "${{submenu:+$submenu>}}$entry"'],
        capture_output=True,
        text=True,
        env={**os.environ, "cfg": str(cfg), "want": KERNEL},
        check=True,
    ).stdout.strip()
    assert found.endswith(f">gnulinux-{KERNEL}-advanced-tether-testbed-root"), found
    (root / "etc/default/grub.d/99-tether-kernel.cfg").write_text(f'GRUB_DEFAULT="{found}"\n')
    assert booted(root) == OTHER  # grub.cfg not regenerated yet: the old default still holds
    standin(root, "update-grub")
    assert f'set default="{found}"' in cfg.read_text()
    assert booted(root) == KERNEL

    # A default whose kernel is gone boots nothing of /boot: the host's kernel, uname -r unchanged.
    (root / f"boot/vmlinuz-{KERNEL}").unlink()
    assert booted(root) == ""


def test_no_grub_cfg_or_an_unknown_default_leaves_the_hosts_kernel(root: Path) -> None:
    assert booted(root) == ""
    (root / "etc/default/grub.d/99-tether-kernel.cfg").write_text('GRUB_DEFAULT="no-such-entry"\n')
    standin(root, "update-grub")
    assert booted(root) == ""
    # By index: "Advanced options" > [OTHER, OTHER (recovery), KERNEL, KERNEL (recovery)][2]
    (root / "etc/default/grub.d/99-tether-kernel.cfg").write_text('GRUB_DEFAULT="1>2"\n')
    standin(root, "update-grub")
    assert booted(root) == KERNEL
