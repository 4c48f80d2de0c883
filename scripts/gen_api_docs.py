"""Generate docs/api.md, the API reference, from the comments of proto/tether/v1/*.proto.

Usage: python scripts/gen_api_docs.py [--check] [--proto-root DIR] [--out FILE]

The protos are compiled with protoc (grpc_tools) into a descriptor set with source info, so the
comments are protoc's own reading of them. --check fails when FILE differs from what the protos
give (`make api-check` runs it, as `make check-protos` does for the generated code).
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import descriptor_pb2 as d
from grpc_tools import protoc  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT = ROOT / "docs" / "api.md"
PACKAGE_DIR = Path("tether") / "v1"

# SourceCodeInfo paths: the field numbers of the descriptor messages.
FILE_MESSAGE, FILE_ENUM, FILE_SERVICE, FILE_SYNTAX = 4, 5, 6, 12
MESSAGE_FIELD, MESSAGE_NESTED, MESSAGE_ENUM, MESSAGE_ONEOF = 2, 3, 4, 8
ENUM_VALUE, SERVICE_METHOD = 2, 2

Path_ = tuple[int, ...]
SCALARS = {
    v: k.removeprefix("TYPE_").lower()
    for k, v in d.FieldDescriptorProto.Type.items()
    if k not in ("TYPE_MESSAGE", "TYPE_ENUM", "TYPE_GROUP")
}


def descriptor_set(proto_root: Path = PROTO_ROOT) -> d.FileDescriptorSet:
    """The package's files, compiled with their comments (SourceCodeInfo)."""
    protos = sorted(p.relative_to(proto_root).as_posix() for p in (proto_root / PACKAGE_DIR).glob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.binpb"
        args = ["protoc", f"-I{proto_root}", f"-I{include}", "--include_source_info"]
        if protoc.main([*args, f"--descriptor_set_out={out}", *protos]) != 0:
            raise SystemExit("protoc failed")
        return d.FileDescriptorSet.FromString(out.read_bytes())


def comments(f: d.FileDescriptorProto) -> dict[Path_, str]:
    """Each element's comment (leading, then trailing) by source path; paragraphs kept."""
    out: dict[Path_, str] = {}
    for loc in f.source_code_info.location:
        text = paragraphs(loc.leading_comments + "\n\n" + loc.trailing_comments)
        if text:
            out[tuple(loc.path)] = text
    for loc in f.source_code_info.location:
        if tuple(loc.path) == (FILE_SYNTAX,) and loc.leading_detached_comments:
            out[()] = paragraphs(loc.leading_detached_comments[0])  # the file's opening comment
    return out


def paragraphs(text: str) -> str:
    """Comment lines joined into paragraphs (blank lines separate them)."""
    blocks = [" ".join(line.strip() for line in b.splitlines()) for b in text.split("\n\n")]
    return "\n\n".join(b.strip() for b in blocks if b.strip())


def messages(
    items: list[d.DescriptorProto], path: Path_, prefix: str = ""
) -> Iterator[tuple[str, d.DescriptorProto, Path_]]:
    """Every message (nested ones as Outer.Inner), map entries left out."""
    for i, m in enumerate(items):
        if m.options.map_entry:
            continue
        name, here = prefix + m.name, (*path, i)
        yield name, m, here
        yield from messages(list(m.nested_type), (*here, MESSAGE_NESTED), name + ".")


def enums(f: d.FileDescriptorProto) -> Iterator[tuple[str, d.EnumDescriptorProto, Path_]]:
    for i, e in enumerate(f.enum_type):
        yield e.name, e, (FILE_ENUM, i)
    for name, m, path in messages(list(f.message_type), (FILE_MESSAGE,)):
        for i, e in enumerate(m.enum_type):
            yield f"{name}.{e.name}", e, (*path, MESSAGE_ENUM, i)


def anchor(kind: str, name: str) -> str:
    """The GitHub anchor of the heading "kind name"."""
    return f"{kind}-{name}".lower().replace(".", "").replace(" ", "-")


def type_link(type_name: str, package: str, kind: str = "message") -> str:
    """A message or enum name, linked to its section when it is ours."""
    full = type_name.lstrip(".")
    if not full.startswith(package + "."):
        return f"`{full}`"
    short = full.removeprefix(package + ".")
    return f"[`{short}`](#{anchor(kind, short)})"


def field_type(fld: d.FieldDescriptorProto, maps: dict[str, d.DescriptorProto], package: str) -> str:
    if fld.type_name.lstrip(".") in maps:
        key, value = maps[fld.type_name.lstrip(".")].field
        if value.type in SCALARS:
            return f"`map<{SCALARS[key.type]}, {SCALARS[value.type]}>`"
        return f"map&lt;`{SCALARS[key.type]}`, {field_type(value, maps, package)}&gt;"
    if fld.type in SCALARS:
        base = f"`{SCALARS[fld.type]}`"
    else:
        kind = "enum" if fld.type == d.FieldDescriptorProto.TYPE_ENUM else "message"
        base = type_link(fld.type_name, package, kind)
    repeated = fld.label == d.FieldDescriptorProto.LABEL_REPEATED
    return f"repeated {base}" if repeated else base


def cell(text: str) -> str:
    """Text for a table cell: one line, pipes escaped."""
    return text.replace("\n\n", " ").replace("|", "\\|") or "—"


def map_entries(fds: d.FileDescriptorSet) -> dict[str, d.DescriptorProto]:
    out: dict[str, d.DescriptorProto] = {}
    for f in fds.file:
        for name, m, _ in messages(list(f.message_type), (FILE_MESSAGE,)):
            for nested in m.nested_type:
                if nested.options.map_entry:
                    out[f"{f.package}.{name}.{nested.name}"] = nested
    return out


@dataclass(frozen=True)
class Context:
    """What rendering a field's type needs: its package and the map entry messages."""

    package: str
    maps: dict[str, d.DescriptorProto]


def render_services(f: d.FileDescriptorProto, notes: dict[Path_, str]) -> Iterator[str]:
    for si, svc in enumerate(f.service):
        yield f"### service {svc.name}\n"
        yield notes.get((FILE_SERVICE, si), "") + "\n"
        for mi, rpc in enumerate(svc.method):
            req = ("stream " if rpc.client_streaming else "") + type_link(rpc.input_type, f.package)
            resp = ("stream " if rpc.server_streaming else "") + type_link(rpc.output_type, f.package)
            yield f"#### rpc {svc.name}.{rpc.name}\n"
            yield f"{req} → {resp}\n"
            yield notes.get((FILE_SERVICE, si, SERVICE_METHOD, mi), "") + "\n"


def render_message(
    name: str, m: d.DescriptorProto, path: Path_, notes: dict[Path_, str], ctx: Context
) -> Iterator[str]:
    yield f"### message {name}\n"
    yield notes.get(path, "") + "\n"
    if not m.field:
        yield "No fields.\n"
        return
    for i, oneof in enumerate(m.oneof_decl):
        yield f"Oneof `{oneof.name}`: {cell(notes.get((*path, MESSAGE_ONEOF, i), ''))}\n"
    yield "| Field | Number | Type | Description |"
    yield "|---|---|---|---|"
    for i, fld in enumerate(m.field):
        text = notes.get((*path, MESSAGE_FIELD, i), "")
        if fld.HasField("oneof_index") and not fld.proto3_optional:
            text = f"One of `{m.oneof_decl[fld.oneof_index].name}`. {text}"
        kind = field_type(fld, ctx.maps, ctx.package)
        yield f"| `{fld.name}` | {fld.number} | {cell(kind)} | {cell(text)} |"
    yield ""


def render_enum(name: str, e: d.EnumDescriptorProto, path: Path_, notes: dict[Path_, str]) -> Iterator[str]:
    yield f"### enum {name}\n"
    yield notes.get(path, "") + "\n"
    yield "| Name | Number | Description |"
    yield "|---|---|---|"
    for i, v in enumerate(e.value):
        yield f"| `{v.name}` | {v.number} | {cell(notes.get((*path, ENUM_VALUE, i), ''))} |"
    yield ""


def render(fds: d.FileDescriptorSet) -> str:
    maps = map_entries(fds)
    lines = [
        "# API reference",
        "",
        "<!-- Generated by scripts/gen_api_docs.py from proto/tether/v1/*.proto: do not edit by hand;",
        "     run `make api-docs` after changing a .proto (`make api-check` fails on drift). -->",
        "",
        "The gRPC contract of tether, package `tether.v1`, from the comments of its `.proto` files.",
        "`buf lint` and `buf breaking` check it (`make api-check`, see `proto/buf.yaml`).",
        "",
    ]
    for f in sorted(fds.file, key=lambda f: f.name):
        lines.append(f"- [{f.name}](#{f.name.replace('/', '').replace('.', '')})")
    lines.append("")
    for f in sorted(fds.file, key=lambda f: f.name):
        notes = comments(f)
        lines += [f"## {f.name}", "", notes.get((), ""), ""]
        lines += render_services(f, notes)
        for name, m, path in messages(list(f.message_type), (FILE_MESSAGE,)):
            lines += render_message(name, m, path, notes, Context(f.package, maps))
        for name, e, path in enums(f):
            lines += render_enum(name, e, path, notes)
    text = "\n".join(lines)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the reference is stale")
    parser.add_argument("--proto-root", type=Path, default=PROTO_ROOT)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    text = render(descriptor_set(args.proto_root.resolve()))
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            diff = difflib.unified_diff(
                current.splitlines(), text.splitlines(), "current", "fresh", lineterm=""
            )
            print("\n".join(list(diff)[:40]), file=sys.stderr)
            print(f"{args.out} is stale: run make api-docs", file=sys.stderr)
            return 1
        print(f"{args.out.name} is up to date")
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
