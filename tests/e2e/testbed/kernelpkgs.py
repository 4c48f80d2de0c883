"""Test-fixture kernel packages (TEST FIXTURES ONLY) for the local apt repo: a kernel pin on an nspawn node.

A testbed node runs the host's kernel, so these packages stand in for a kernel and for the boot chain
around it, with the interfaces tether's kernel steps use on Debian/Ubuntu
(controller/render/components/kernel.j2, kernel_verify.j2), which run on the node unchanged:

* ``linux-image-<KERNEL>``: the "kernel" (marker files /boot/vmlinuz-<KERNEL>, /boot/config-<KERNEL>,
  /lib/modules/<KERNEL>/); its postinst makes the initramfs and asks for a restart in
  /run/reboot-required, as a real kernel package's hooks do. It depends on the boot stand-in.
* ``linux-headers-<KERNEL>``: a marker tree /usr/src/linux-headers-<KERNEL>.
* ``tether-boot-standin``: ``update-grub``, ``update-initramfs``, a boot-time unit that plays the boot
  loader (it boots grub.cfg's default entry: records that kernel's version for this boot only) and a
  ``uname`` in /usr/local/bin that answers ``-r`` with it (``standins/boot_standin.py``). So ``uname -r``
  says <KERNEL> only after a reboot into a default entry that boots it: kernel-verify fails when the
  step did not set the default, or when nothing rebooted.

``KERNEL`` is what a test pins in ``spec.kernel.version``; it is never a real kernel's release.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tests.e2e.testbed import packages

KERNEL = "6.1.0-999-tether-fixture"
KERNEL_DEB_VERSION = "6.1.999-1~tether1"
BOOT_STANDIN_VERSION = "1.0~tether1"
BOOT_STANDIN = Path(__file__).parent / "standins" / "boot_standin.py"
BOOT_STANDIN_BIN = "/usr/lib/tether-boot-standin/boot-standin"
RELEASE_FILE = "/run/tether-boot-standin/release"  # the kernel this boot "runs" (see boot_standin.py)

UNAME = f"""\
#!/bin/sh
# TEST FIXTURE ONLY (tether e2e testbed): uname -r says which kernel the boot loader stand-in booted
# this time (tether-boot-standin.service, {RELEASE_FILE}); anything else, and any
# boot without that record, is the real /usr/bin/uname.
release=$(cat {RELEASE_FILE} 2>/dev/null) || exec /usr/bin/uname "$@"
[ -n "$release" ] || exec /usr/bin/uname "$@"
case "$*" in
  -r | --kernel-release) printf '%s\\n' "$release" ;;
  *) exec /usr/bin/uname "$@" ;;
esac
"""

BOOT_UNIT = f"""\
# TEST FIXTURE ONLY (tether e2e testbed): the boot loader stand-in. Boots /boot/grub/grub.cfg's default
# entry, that is: records the kernel it names in /run/tether-boot-standin/release for this boot.
[Unit]
Description=tether testbed boot loader stand-in (TEST FIXTURE): the kernel this boot runs
DefaultDependencies=no
After=local-fs.target
Before=sysinit.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={BOOT_STANDIN_BIN} boot

[Install]
WantedBy=sysinit.target
"""

GRUB_DEFAULTS = """\
# TEST FIXTURE ONLY (tether e2e testbed): like grub's /etc/default/grub, read by the update-grub stand-in.
GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_DISTRIBUTOR=Debian
"""

BOOT_POSTINST = """\
#!/bin/sh
# TEST FIXTURE ONLY: the boot loader stand-in boots the default entry from the next boot on.
set -e
if [ "$1" = configure ]; then
  [ -f /boot/grub/grub.cfg ] || update-grub >/dev/null 2>&1 || true
  systemctl enable tether-boot-standin.service >/dev/null 2>&1 || true
fi
"""

BOOT_PRERM = """\
#!/bin/sh
set -e
if [ "$1" = remove ]; then
  systemctl disable tether-boot-standin.service >/dev/null 2>&1 || true
fi
"""

IMAGE_POSTINST = f"""\
#!/bin/sh
# TEST FIXTURE ONLY: what linux-image's hooks do (/etc/kernel/postinst.d): make the initramfs, and ask
# for a restart the way update-notifier's hook does.
set -e
if [ "$1" = configure ]; then
  update-initramfs -c -k {KERNEL}
  printf '*** System restart required ***\\n' > /run/reboot-required
  echo linux-image-{KERNEL} >> /run/reboot-required.pkgs
fi
"""

IMAGE_POSTRM = f"""\
#!/bin/sh
set -e
if [ "$1" = remove ] || [ "$1" = purge ]; then
  rm -f /boot/initrd.img-{KERNEL}
fi
"""


def build_all(out: Path) -> list[Path]:
    """Build the three .debs into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        return _build(Path(tmp), out)


def _build(work: Path, out: Path) -> list[Path]:
    marker = f"TEST FIXTURE: not a kernel. tether e2e testbed stand-in for linux-image-{KERNEL}.\n"
    boot = packages._deb(
        work,
        out,
        "tether-boot-standin",
        BOOT_STANDIN_VERSION,
        "python3",
        {
            BOOT_STANDIN_BIN.lstrip("/"): BOOT_STANDIN,
            "usr/sbin/update-grub": f'#!/bin/sh\nexec {BOOT_STANDIN_BIN} update-grub "$@"\n',
            "usr/sbin/update-initramfs": f'#!/bin/sh\nexec {BOOT_STANDIN_BIN} update-initramfs "$@"\n',
            "usr/local/bin/uname": UNAME,
            "lib/systemd/system/tether-boot-standin.service": BOOT_UNIT,
            "etc/default/grub": GRUB_DEFAULTS,
        },
        {"postinst": BOOT_POSTINST, "prerm": BOOT_PRERM},
        summary="Stand-in for grub and initramfs-tools on an nspawn node (update-grub, update-initramfs, "
        "a boot loader that 'boots' grub.cfg's default kernel, uname -r)",
        fields={"Provides": "linux-initramfs-tool"},
    )
    image = packages._deb(
        work,
        out,
        f"linux-image-{KERNEL}",
        KERNEL_DEB_VERSION,
        "tether-boot-standin",
        {
            f"boot/vmlinuz-{KERNEL}": marker,
            f"boot/config-{KERNEL}": f"# TEST FIXTURE kernel config for {KERNEL}\nCONFIG_MODULES=y\n",
            f"boot/System.map-{KERNEL}": marker,
            f"lib/modules/{KERNEL}/modules.order": "",
        },
        {"postinst": IMAGE_POSTINST, "postrm": IMAGE_POSTRM},
        summary=f"Stand-in for a Linux {KERNEL} kernel image (marker files; nothing boots it)",
    )
    headers = packages._deb(
        work,
        out,
        f"linux-headers-{KERNEL}",
        KERNEL_DEB_VERSION,
        "",
        {f"usr/src/linux-headers-{KERNEL}/README.tether-test-fixture": marker},
        {},
        summary=f"Stand-in for the Linux {KERNEL} kernel headers (a marker)",
    )
    return [boot, image, headers]
