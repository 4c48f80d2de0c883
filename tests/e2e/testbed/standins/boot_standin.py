#!/usr/bin/python3
"""TEST FIXTURE ONLY (tether e2e testbed): a boot loader and initramfs stand-in for nspawn nodes.

A testbed node is a container: it runs the host's kernel, whatever is in its /boot. So that a kernel
pin can be shown end to end there (install, boot default, reboot, verify), this stand-in plays the
parts of the boot chain, with the interfaces tether's kernel step uses on Debian and Ubuntu:

* ``update-grub``: writes /boot/grub/grub.cfg from /boot/vmlinuz-* and GRUB_DEFAULT (/etc/default/grub,
  then /etc/default/grub.d/*.cfg), laid out like grub-mkconfig's 00_header and 10_linux (a first
  "simple" entry, an "Advanced options" submenu with a normal and a recovery entry per kernel);
* ``update-initramfs -c|-u -k VERSION``: writes a marker /boot/initrd.img-VERSION;
* ``boot`` (``tether-boot-standin.service``, early in every boot): the "boot loader". It resolves
  grub.cfg's default entry as GRUB does (an index, an id or a title, ``>`` between submenu levels) and
  records the kernel that entry boots in /run/tether-boot-standin/release. /run is a tmpfs, so that
  record belongs to this boot only: a kernel installed after boot is not "running" until the next one.

The stand-in ``uname`` (/usr/local/bin/uname, before /usr/bin in every PATH tether's steps use) answers
``-r`` with that record and passes everything else, or a boot without a record, to /usr/bin/uname.
Built into the ``tether-boot-standin`` package by tests/e2e/testbed/kernelpkgs.py. Stdlib only.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field

# Every path is under ROOT: "" on a node; a temporary directory in tests/e2e/test_boot_standin.py.
ROOT = os.environ.get("TETHER_BOOT_STANDIN_ROOT", "")
GRUB_CFG = "/boot/grub/grub.cfg"
RUN_DIR = "/run/tether-boot-standin"
RELEASE = f"{RUN_DIR}/release"


def at(path: str) -> str:
    return ROOT + path


ROOT_ID = "tether-testbed-root"  # grub-mkconfig uses the root file system's UUID here
OS_NAME = "Debian GNU/Linux"
CLASSES = "--class debian --class gnu-linux --class gnu --class os"


def say(message: str) -> None:
    print(f"tether-boot-standin: {message}", flush=True)


# -- update-initramfs -----------------------------------------------------------------------------


def update_initramfs(argv: list[str]) -> int:
    mode, version = "", ""
    args = iter(argv)
    for arg in args:
        if arg in ("-c", "-u", "-d"):
            mode = arg
        elif arg == "-k":
            version = next(args, "")
        elif arg.startswith("-"):
            continue  # -v, -t, -b DIR ...: accepted, ignored
    if not mode or not version:
        print("usage: update-initramfs {-c|-u|-d} -k VERSION (TEST FIXTURE stand-in)", file=sys.stderr)
        return 2
    versions = installed_kernels() if version == "all" else [version]
    for v in versions:
        initrd = at(f"/boot/initrd.img-{v}")
        if mode == "-d":
            if os.path.exists(initrd):
                os.remove(initrd)
            continue
        if not os.path.isdir(at(f"/lib/modules/{v}")):
            print(
                f"update-initramfs: /lib/modules/{v} does not exist; is linux-image-{v} installed?",
                file=sys.stderr,
            )
            return 1
        say(f"{'Generating' if mode == '-c' else 'Updating'} /boot/initrd.img-{v}")
        write(initrd, f"TEST FIXTURE initramfs for {v} (tether e2e testbed stand-in)\n")
    return 0


# -- update-grub ----------------------------------------------------------------------------------


def installed_kernels() -> list[str]:
    """Kernel versions in /boot, newest first (grub-mkconfig's version sort)."""
    versions = [os.path.basename(p).removeprefix("vmlinuz-") for p in glob.glob(at("/boot/vmlinuz-*"))]
    return sorted(versions, key=version_key, reverse=True)


def version_key(version: str) -> list[tuple[int, int | str]]:
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"[.\-+~_]", version)]


def grub_default() -> str:
    """GRUB_DEFAULT as grub-mkconfig sees it: /etc/default/grub, then grub.d/*.cfg, sourced by sh."""
    script = (
        'GRUB_DEFAULT=0; [ ! -f "$1/etc/default/grub" ] || . "$1/etc/default/grub"; '
        'for f in "$1"/etc/default/grub.d/*.cfg; do [ ! -f "$f" ] || . "$f"; done; printf %s "$GRUB_DEFAULT"'
    )
    return subprocess.run(
        ["/bin/sh", "-c", script, "sh", ROOT], capture_output=True, text=True, check=True
    ).stdout


def entry_lines(version: str, title: str, entry_id: str, indent: str, recovery: bool) -> list[str]:
    options = "ro single" if recovery else "ro quiet"
    return [
        f"{indent}menuentry '{title}' {CLASSES} $menuentry_id_option '{entry_id}' {{",
        f"{indent}\tlinux\t/boot/vmlinuz-{version} root=UUID={ROOT_ID} {options}",
        *(
            [f"{indent}\tinitrd\t/boot/initrd.img-{version}"]
            if os.path.exists(at(f"/boot/initrd.img-{version}"))
            else []
        ),
        f"{indent}}}",
    ]


def update_grub(argv: list[str]) -> int:
    kernels = installed_kernels()
    default = grub_default()
    lines = [
        "#",
        "# DO NOT EDIT THIS FILE",
        "#",
        "# TEST FIXTURE ONLY: written by the tether e2e testbed's update-grub stand-in, laid out like",
        "# grub-mkconfig's output (00_header, 10_linux). No boot loader reads it but the stand-in's.",
        "#",
        "### BEGIN /etc/grub.d/00_header ###",
        'if [ "${next_entry}" ] ; then',
        '   set default="${next_entry}"',
        "   set next_entry=",
        "else",
        f'   set default="{default}"',
        "fi",
        "### END /etc/grub.d/00_header ###",
        "",
        "### BEGIN /etc/grub.d/10_linux ###",
    ]
    say("Generating grub configuration file ...")
    if kernels:
        lines += entry_lines(kernels[0], OS_NAME, f"gnulinux-simple-{ROOT_ID}", "", False)
        lines.append(
            f"submenu 'Advanced options for {OS_NAME}' $menuentry_id_option 'gnulinux-advanced-{ROOT_ID}' {{"
        )
        for v in kernels:
            print(f"Found linux image: /boot/vmlinuz-{v}", file=sys.stderr)
            title = f"{OS_NAME}, with Linux {v}"
            lines += entry_lines(v, title, f"gnulinux-{v}-advanced-{ROOT_ID}", "\t", False)
            lines += entry_lines(
                v, f"{title} (recovery mode)", f"gnulinux-{v}-recovery-{ROOT_ID}", "\t", True
            )
        lines.append("}")
    lines.append("### END /etc/grub.d/10_linux ###")
    write(at(GRUB_CFG), "\n".join(lines) + "\n")
    say("done")
    return 0


# -- the boot loader ------------------------------------------------------------------------------


@dataclass
class Entry:
    title: str
    id: str
    kernel: str = ""  # the version its ``linux /boot/vmlinuz-VERSION`` line boots
    children: list[Entry] = field(default_factory=list)
    submenu: bool = False


ENTRY_RE = re.compile(r"^\s*(menuentry|submenu)\s+'([^']*)'.*\$menuentry_id_option\s+'([^']*)'\s*\{\s*$")
LINUX_RE = re.compile(r"^\s*linux\s+/boot/vmlinuz-(\S+)")
DEFAULT_RE = re.compile(r'^\s*set default="([^"$]*)"\s*$')


def parse(text: str) -> tuple[str, list[Entry]]:
    """grub.cfg's default (the one not taken from next_entry) and its menu tree."""
    default = "0"
    top: list[Entry] = []
    stack: list[Entry] = []
    for line in text.splitlines():
        if match := DEFAULT_RE.match(line):
            default = match.group(1)
        elif match := ENTRY_RE.match(line):
            entry = Entry(title=match.group(2), id=match.group(3), submenu=match.group(1) == "submenu")
            (stack[-1].children if stack else top).append(entry)
            stack.append(entry)
        elif (match := LINUX_RE.match(line)) and stack:
            stack[-1].kernel = match.group(1)
        elif line.strip() == "}" and stack:
            stack.pop()
    return default, top


def resolve(default: str, top: list[Entry]) -> Entry | None:
    """The entry GRUB boots for ``default``: ``>``-separated levels, each an index, id or title."""
    level, chosen = top, None
    for part in (default or "0").split(">"):
        found = [e for e in level if part in (e.id, e.title)]
        if not found and part.isdigit() and int(part) < len(level):
            found = [level[int(part)]]
        if not found:
            return None
        chosen = found[0]
        level = chosen.children
    if chosen is not None and chosen.submenu:
        chosen = chosen.children[0] if chosen.children else None
    return chosen


def boot(argv: list[str]) -> int:
    os.makedirs(at(RUN_DIR), exist_ok=True)
    if os.path.exists(at(RELEASE)):
        os.remove(at(RELEASE))
    try:
        with open(at(GRUB_CFG)) as f:
            default, top = parse(f.read())
    except FileNotFoundError:
        say(f"no {GRUB_CFG}: the node runs the host's kernel")
        return 0
    entry = resolve(default, top)
    if entry is None or not entry.kernel:
        say(f"default entry {default!r} not found in {GRUB_CFG}: the node runs the host's kernel")
        return 0
    if not os.path.isfile(at(f"/boot/vmlinuz-{entry.kernel}")):
        say(
            f"{entry.title!r} boots /boot/vmlinuz-{entry.kernel}, which is missing: "
            "the node runs the host's kernel"
        )
        return 0
    write(at(RELEASE), entry.kernel + "\n")
    say(f"booted {entry.title!r} (default {default!r}): uname -r now says {entry.kernel}")
    return 0


# -- helpers --------------------------------------------------------------------------------------


def write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


COMMANDS = {"update-grub": update_grub, "update-initramfs": update_initramfs, "boot": boot}


def main() -> int:
    name = os.path.basename(sys.argv[0])
    if name in COMMANDS:
        return COMMANDS[name](sys.argv[1:])
    if len(sys.argv) > 1 and sys.argv[1] in COMMANDS:
        return COMMANDS[sys.argv[1]](sys.argv[2:])
    print(f"usage: {name} {{{'|'.join(COMMANDS)}}} ... (TEST FIXTURE stand-in)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
