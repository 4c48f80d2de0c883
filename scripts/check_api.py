"""API hygiene: `buf lint` on proto/ and `buf breaking` against the released API's image.

Usage: python scripts/check_api.py [--proto-root DIR] [--install | --update-baseline [--ref REF]]

The released API is proto/tether-v1.binpb, a descriptor image committed with the tree (a shallow
clone has it too); `make api-baseline` (--update-baseline) records the current protos, or those
of a git REF, as the new baseline when an API version is released. buf is the pinned
@bufbuild/buf from the npm registry, installed under .cache/buf on first use. A machine that
cannot install it skips the check, except under CI=true or as root (where
scripts/system-deps installs npm): there the check fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PROTO_DIR = Path("tether") / "v1"
BASELINE = PROTO_ROOT / "tether-v1.binpb"
BUF_VERSION = "1.75.0"
BUF_PREFIX = ROOT / ".cache" / "buf"
BUF = BUF_PREFIX / "node_modules" / ".bin" / "buf"


class Unavailable(Exception):
    """buf is not installed and cannot be installed here."""


def must_have_buf() -> bool:
    """CI and root (where system-deps installs npm) fail without buf; elsewhere the check skips."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes") or os.geteuid() == 0


def installed_version(buf: Path) -> str:
    if not buf.exists():
        return ""
    try:
        done = subprocess.run([str(buf), "--version"], capture_output=True, text=True, check=False)
    except OSError:
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def ensure_buf() -> Path:
    """The pinned buf, installed with npm into .cache/buf when missing or of another version."""
    if installed_version(BUF) == BUF_VERSION:
        return BUF
    npm = shutil.which("npm")
    if npm is None:
        raise Unavailable("npm is not installed (scripts/system-deps installs it as root)")
    BUF_PREFIX.mkdir(parents=True, exist_ok=True)
    cmd = [npm, "install", "--prefix", str(BUF_PREFIX), "--no-save", "--no-audit", "--no-fund"]
    done = subprocess.run([*cmd, f"@bufbuild/buf@{BUF_VERSION}"], capture_output=True, text=True)
    if done.returncode != 0 or installed_version(BUF) != BUF_VERSION:
        raise Unavailable(f"npm could not install @bufbuild/buf@{BUF_VERSION}: {done.stderr.strip()[-800:]}")
    return BUF


def buf(*args: str) -> int:
    """Run buf from the repository root; its findings go to our stdout and stderr."""
    return subprocess.run([str(ensure_buf()), *args], cwd=ROOT, check=False).returncode


def copy_from_ref(ref: str, dest: Path) -> None:
    """The protos (and buf.yaml) of a git ref, written under ``dest``."""
    listing = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{ref}:proto/{PROTO_DIR.as_posix()}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    (dest / PROTO_DIR).mkdir(parents=True)
    for name in (n for n in listing if n.endswith(".proto")):
        blob = f"{ref}:proto/{PROTO_DIR.as_posix()}/{name}"
        text = subprocess.run(["git", "show", blob], cwd=ROOT, capture_output=True, check=True).stdout
        (dest / PROTO_DIR / name).write_bytes(text)
    shutil.copyfile(PROTO_ROOT / "buf.yaml", dest / "buf.yaml")


def update_baseline(ref: str) -> int:
    """Write the baseline image from the working tree's protos, or from those of ``ref``."""
    if not ref:
        return buf("build", str(PROTO_ROOT), "--exclude-source-info", "-o", str(BASELINE))
    with tempfile.TemporaryDirectory() as tmp:
        copy_from_ref(ref, Path(tmp))
        return buf("build", tmp, "--exclude-source-info", "-o", str(BASELINE))


def check(proto_root: Path) -> int:
    """buf lint, then buf breaking against the baseline; non-zero if either finds something."""
    if not BASELINE.exists():
        print(f"no baseline image at {BASELINE.relative_to(ROOT)}: run make api-baseline", file=sys.stderr)
        return 1
    failed = False
    if buf("lint", str(proto_root)) != 0:
        print("buf lint failed (proto/buf.yaml lists the rules and their exceptions)", file=sys.stderr)
        failed = True
    if buf("breaking", str(proto_root), "--against", str(BASELINE)) != 0:
        print(
            "buf breaking: the API changed incompatibly with the released one "
            f"({BASELINE.relative_to(ROOT)}); add instead of changing, or release tether.v2",
            file=sys.stderr,
        )
        failed = True
    if failed:
        return 1
    print(f"buf {BUF_VERSION}: lint clean, no breaking change against {BASELINE.relative_to(ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--proto-root", type=Path, default=PROTO_ROOT, help="the buf module to check")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--install", action="store_true", help="install the pinned buf only")
    action.add_argument("--update-baseline", action="store_true", help="record the released API")
    parser.add_argument("--ref", default="", help="with --update-baseline: the protos of this git ref")
    args = parser.parse_args(argv)
    try:
        if args.install:
            print(f"buf {BUF_VERSION} at {ensure_buf()}")
            return 0
        if args.update_baseline:
            return update_baseline(args.ref)
        return check(args.proto_root.resolve())
    except Unavailable as exc:
        if must_have_buf():
            print(f"API check failed: {exc}", file=sys.stderr)
            return 1
        print(f"API check skipped: {exc}", file=sys.stderr)
        return 0


if __name__ == "__main__":
    sys.exit(main())
