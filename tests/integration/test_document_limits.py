"""Issue 10, item 4: one size budget end to end (documents, what clients can receive)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.harness import Controller
from tether.nodeagent.limits import MAX_DOCUMENT_BYTES, MAX_RECEIVE_BYTES, KiB, MiB

pytestmark = pytest.mark.integration

LINE = "        echo 'padding padding padding padding padding padding padding padding'\n"


def _document(tmp_path: Path, name: str, size: int) -> Path:
    """A valid environment document of about ``size`` bytes: one custom step with a long script."""
    head = (
        "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\n"
        f"metadata:\n  name: {name}\nspec:\n  customTemplates:\n    - name: big\n      inline: |\n"
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(head + LINE * ((size - len(head)) // len(LINE)))
    return path


def _lines(out: str, err: str) -> list[str]:
    return [line for line in (out + err).splitlines() if line.strip()]


def test_a_document_over_the_limit_is_refused_by_validate_and_apply_in_one_line(
    controller: Controller, tmp_path: Path
) -> None:
    big = _document(tmp_path, "big", 3 * MiB // 2)
    size = big.stat().st_size
    expected = f"over the limit of 1 MiB ({MAX_DOCUMENT_BYTES} bytes)"
    for verb in ("validate", "apply"):
        run = controller.ctl("env", verb, "-f", str(big), check=False)
        assert run.returncode != 0, verb
        lines = _lines(run.stdout, run.stderr)
        assert len(lines) == 1, (verb, lines)
        assert f"({size} bytes)" in lines[0] and expected in lines[0], (verb, lines)
    assert json.loads(controller.ctl("env", "list", "-o", "json").stdout) == []


def test_the_controller_refuses_a_document_over_its_limit_in_one_line(
    controller: Controller, tmp_path: Path
) -> None:
    # Over the document limit, still under the receive limit: the controller's own check says why.
    doc = _document(tmp_path, "edge", MAX_DOCUMENT_BYTES + 16 * KiB)
    assert doc.stat().st_size < MAX_RECEIVE_BYTES
    run = controller.ctl("env", "apply", "-f", str(doc), "--max-document-bytes", str(2 * MiB), check=False)
    assert run.returncode != 0
    lines = _lines(run.stdout, run.stderr)
    assert len(lines) == 1, lines
    assert f"over the limit of 1 MiB ({MAX_DOCUMENT_BYTES} bytes)" in lines[0]


def test_env_list_works_when_the_documents_add_up_to_more_than_grpcs_default(
    controller: Controller, tmp_path: Path
) -> None:
    names = [f"e{i}" for i in range(5)]  # 5 x 0.95 MiB: the reply is over gRPC's 4 MiB default
    for name in names:
        controller.ctl("env", "apply", "-f", str(_document(tmp_path, name, 95 * MiB // 100)))
    listed = json.loads(controller.ctl("env", "list", "-o", "json").stdout)
    assert sorted(e["name"] for e in listed) == names
    assert "e4" in controller.ctl("env", "list").stdout
