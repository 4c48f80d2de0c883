"""Regenerate the one generated package (proto/tether/v1/*_pb2*.py and stubs).

Usage: python scripts/gen_protos.py [--check]

--check regenerates into a temporary directory and fails when the checked-in
files differ: CI runs it so the generated code never drifts from the .proto files.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE = PROTO_ROOT / "tether" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def generate(out: Path) -> None:
    # protoc-gen-mypy lives next to this interpreter (the venv's bin directory).
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PACKAGE.glob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--mypy_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_grpc_out={out}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def generated_files(base: Path) -> dict[str, Path]:
    pkg = base / "tether" / "v1"
    return {p.name: p for p in pkg.iterdir() if p.name.endswith(GENERATED_SUFFIXES)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the checked-in code is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        generate(out)
        fresh = generated_files(out)
        current = generated_files(PROTO_ROOT)
        if args.check:
            stale = sorted(
                name
                for name in set(fresh) | set(current)
                if name not in fresh
                or name not in current
                or not filecmp.cmp(fresh[name], current[name], False)
            )
            if stale:
                print("generated protobuf code is stale: " + ", ".join(stale), file=sys.stderr)
                print("run: python scripts/gen_protos.py", file=sys.stderr)
                return 1
            print("generated protobuf code is up to date")
            return 0
        for name, path in current.items():
            if name not in fresh:
                path.unlink()
        for name, path in fresh.items():
            shutil.copyfile(path, PACKAGE / name)
        print(f"generated {len(fresh)} files in {PACKAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
