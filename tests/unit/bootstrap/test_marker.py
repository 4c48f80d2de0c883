"""Exactly once: every row of ``marker.decide``'s table."""

from __future__ import annotations

from typing import Any

import pytest

from tether.bootstrap.detect import InstallState
from tether.bootstrap.errors import InstallConflict
from tether.bootstrap.marker import Action, decide
from tether.bootstrap.registry import NodeView

ENROLLED = NodeView("gpu-1", "lab", "worker", False, True, "provisioned", "f" * 64)
REVOKED = NodeView("gpu-1", "lab", "worker", True, False, "revoked", "f" * 64)
MARKER_DONE = {"state": "installed", "node_name": "gpu-1", "environment": "lab", "token_id": "old001"}
MARKER_BUSY = {"state": "installing", "node_name": "gpu-1", "environment": "lab", "token_id": "old002"}


def d(state: InstallState, node: NodeView | None, force: bool = False, **kw: Any) -> Any:
    args: dict[str, Any] = {"node_name": "gpu-1", "environment": "lab", "role": "worker", "force": force}
    args.update(kw)
    return decide(state, node, **args)


def test_identity_and_enrolled_is_already_installed_or_a_reinstall_with_force() -> None:
    state = InstallState(marker=MARKER_DONE, identity=True, unit_active="active")
    assert d(state, ENROLLED).action is Action.ALREADY
    assert d(state, ENROLLED, force=True).action is Action.REINSTALL
    # An agent installed some other way (no marker) counts as installed too.
    assert d(InstallState(identity=True), ENROLLED).action is Action.ALREADY


def test_a_fresh_machine_installs_and_a_revoked_name_may_be_enrolled_again() -> None:
    assert d(InstallState(), None).action is Action.INSTALL
    decision = d(InstallState(), REVOKED)
    assert decision.action is Action.INSTALL
    assert decision.stale_token_id == ""


def test_an_unfinished_run_is_redone_revoking_its_token() -> None:
    decision = d(InstallState(marker=MARKER_BUSY), None)
    assert decision.action is Action.INSTALL
    assert decision.stale_token_id == "old002"


def test_installed_but_still_enrolling_is_only_verified() -> None:
    assert d(InstallState(marker=MARKER_DONE, unit_active="activating"), None).action is Action.WAIT
    assert d(InstallState(marker=MARKER_DONE, unit_active="active"), None).action is Action.WAIT


def test_installed_never_enrolled_and_not_running_needs_force() -> None:
    with pytest.raises(InstallConflict, match=r"never enrolled.*--force"):
        d(InstallState(marker=MARKER_DONE, unit_active="failed"), None)
    forced = d(InstallState(marker=MARKER_DONE, unit_active="failed"), None, force=True)
    assert forced.action is Action.INSTALL
    assert forced.stale_token_id == "old001"


@pytest.mark.parametrize(
    ("state", "node", "kw", "message"),
    [
        (InstallState(), ENROLLED, {}, "already enrolled by another machine"),
        (InstallState(marker=MARKER_DONE), ENROLLED, {}, "already enrolled by another machine"),
        (InstallState(identity=True), None, {}, "belongs to another controller"),
        (InstallState(identity=True), REVOKED, {}, "was revoked at the controller"),
        (
            InstallState(marker=MARKER_DONE, identity=True),
            ENROLLED,
            {"node_name": "gpu-2"},
            "already installed as node 'gpu-1'",
        ),
        (InstallState(identity=True), ENROLLED, {"environment": "prod"}, "does not change environment"),
        (InstallState(identity=True), ENROLLED, {"role": "control-plane"}, "does not change environment"),
    ],
)
def test_conflicts_are_refused_even_with_force(
    state: InstallState, node: NodeView | None, kw: dict[str, Any], message: str
) -> None:
    for force in (False, True):
        with pytest.raises(InstallConflict, match=message):
            d(state, node, force=force, **kw)
