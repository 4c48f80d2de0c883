"""docs/api.md is generated from the protos (scripts/gen_api_docs.py): up to date, complete, and
its --check fails once a comment in the protos changes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.unit.api_protos import PROTO_ROOT, ROOT, copy_protos, edit, load_script

SCRIPT = ROOT / "scripts" / "gen_api_docs.py"
API_MD = ROOT / "docs" / "api.md"
docs = load_script("gen_api_docs")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False)


def test_the_reference_is_up_to_date() -> None:
    done = run("--check")
    assert done.returncode == 0, done.stderr


def test_a_changed_rpc_comment_is_drift(tmp_path: Path) -> None:
    root = copy_protos(tmp_path / "proto")
    edit(
        root,
        "admin.proto",
        "  // The controller's version and API version.\n",
        "  // The controller's version, and the API version it serves.\n",
    )
    stale = run("--check", "--proto-root", str(root))
    assert stale.returncode == 1
    assert "api.md is stale: run make api-docs" in stale.stderr
    assert "+The controller's version, and the API version it serves." in stale.stderr  # the diff

    out = tmp_path / "api.md"
    assert run("--proto-root", str(root), "--out", str(out)).returncode == 0
    assert "The controller's version, and the API version it serves." in out.read_text()
    assert run("--check", "--proto-root", str(root), "--out", str(out)).returncode == 0


def test_every_element_is_in_the_reference() -> None:
    text = API_MD.read_text()
    for f in docs.descriptor_set(PROTO_ROOT).file:
        for svc in f.service:
            assert f"### service {svc.name}\n" in text
            for rpc in svc.method:
                assert f"#### rpc {svc.name}.{rpc.name}\n" in text
        for name, m, _ in docs.messages(list(f.message_type), (docs.FILE_MESSAGE,)):
            assert f"### message {name}\n" in text
            for fld in m.field:
                assert f"| `{fld.name}` | {fld.number} | " in text
        for name, e, _ in docs.enums(f):
            assert f"### enum {name}\n" in text
            for value in e.value:
                assert f"| `{value.name}` | {value.number} | " in text


def test_types_streams_and_comments_are_rendered() -> None:
    text = API_MD.read_text()
    watch = text.split("#### rpc AdminService.WatchNodes\n", 1)[1].split("####", 1)[0]
    assert (
        "[`WatchNodesRequest`](#message-watchnodesrequest) → stream [`NodeEvent`](#message-nodeevent)"
        in watch
    )
    assert "list again from 0" in watch  # the RPC's comment, every line of it
    connect = text.split("#### rpc AgentService.Connect\n", 1)[1].split("####", 1)[0]
    assert "stream [`AgentMessage`](#message-agentmessage) → stream [`ControllerMessage`]" in connect
    assert "| `env` | 10 | `map<string, string>` | Non-secret environment variables of the script. |" in text
    assert "| `type` | 1 | [`NodeEventType`](#enum-nodeeventtype) | What happened. |" in text
    assert "| `gpus` | 12 | repeated [`Gpu`](#message-gpu) |" in text
    assert "| `ssh` | 1 | [`SshTarget`](#message-sshtarget) | One of `target`. Over SSH. |" in text
    assert "### enum NodeEventType\n" in text and "### message NodeEvent\n" in text
