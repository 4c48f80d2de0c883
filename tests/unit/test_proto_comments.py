"""Every service, RPC, message, field, oneof, enum and enum value of the protos has a comment
(read from protoc's SourceCodeInfo, as docs/api.md is)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from google.protobuf import descriptor_pb2 as d

from tests.unit.api_protos import PROTO_ROOT, copy_protos, edit, load_script

docs = load_script("gen_api_docs")


def elements(f: d.FileDescriptorProto) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(full name, source path) of every element that needs a comment."""
    for si, svc in enumerate(f.service):
        yield f"{f.package}.{svc.name}", (docs.FILE_SERVICE, si)
        for mi, rpc in enumerate(svc.method):
            yield f"{f.package}.{svc.name}.{rpc.name}", (docs.FILE_SERVICE, si, docs.SERVICE_METHOD, mi)
    for name, m, path in docs.messages(list(f.message_type), (docs.FILE_MESSAGE,)):
        yield f"{f.package}.{name}", path
        for i, fld in enumerate(m.field):
            yield f"{f.package}.{name}.{fld.name}", (*path, docs.MESSAGE_FIELD, i)
        for i, oneof in enumerate(m.oneof_decl):
            yield f"{f.package}.{name}.{oneof.name} (oneof)", (*path, docs.MESSAGE_ONEOF, i)
    for name, e, path in docs.enums(f):
        yield f"{f.package}.{name}", path
        for i, value in enumerate(e.value):
            yield f"{f.package}.{name}.{value.name}", (*path, docs.ENUM_VALUE, i)


def uncommented(proto_root: Path) -> list[str]:
    missing = []
    for f in docs.descriptor_set(proto_root).file:
        notes = docs.comments(f)
        missing += [name for name, path in elements(f) if not notes.get(path)]
    return missing


def test_every_element_has_a_comment() -> None:
    assert uncommented(PROTO_ROOT) == []


def test_the_elements_are_all_seen() -> None:
    names = {name for f in docs.descriptor_set(PROTO_ROOT).file for name, _ in elements(f)}
    assert {
        "tether.v1.AdminService.WatchNodes",
        "tether.v1.Step.env",  # a map field (its entry message needs no comment of its own)
        "tether.v1.BootstrapRequest.target (oneof)",
        "tether.v1.NodeEventType.NODE_EVENT_TYPE_SYNCED",
        "tether.v1.AgentService.Connect",
    } <= names
    assert not any(".EnvEntry" in n for n in names)


def test_a_missing_comment_is_found(tmp_path: Path) -> None:
    root = copy_protos(tmp_path)
    edit(root, "admin.proto", "  // The environment's name (metadata.name of its document).\n", "")
    edit(
        root,
        "common.proto",
        "  // Not set; never sent.\n  EVENT_KIND_UNSPECIFIED",
        "  EVENT_KIND_UNSPECIFIED",
    )
    edit(root, "agent.proto", "  // What to do.\n  oneof kind {", "  oneof kind {")
    edit(root, "admin.proto", "  // The controller's version and API version.\n", "")
    assert sorted(uncommented(root)) == [
        "tether.v1.AdminService.GetVersion",
        "tether.v1.Command.kind (oneof)",
        "tether.v1.Environment.name",
        "tether.v1.EventKind.EVENT_KIND_UNSPECIFIED",
    ]
