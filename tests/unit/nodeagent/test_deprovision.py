"""A reset agent removes its unit, install, config and state; the unit keeps a stopped agent down."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from tether.bootstrap.unit import unit_text
from tether.nodeagent.deprovision import ADMIN_UNIT_DIR, plan_removal, remove, systemd_unit
from tether.nodeagent.errors import RESET_EXIT_CODE, REVOKED_EXIT_CODE, NodeReset, NodeRevoked
from tether.nodeagent.upgrade import Install


def test_the_unit_neither_restarts_nor_fails_an_agent_the_controller_ended() -> None:
    text = unit_text()
    codes = {REVOKED_EXIT_CODE, RESET_EXIT_CODE}
    for key in ("RestartPreventExitStatus", "SuccessExitStatus"):
        m = re.search(rf"^{key}=(.+)$", text, re.MULTILINE)
        assert m is not None, key
        assert {int(c) for c in m.group(1).split()} == codes
    assert NodeRevoked("n1").exit_code == REVOKED_EXIT_CODE and NodeReset("x").exit_code == RESET_EXIT_CODE
    assert str(NodeRevoked("n1")) == "node n1 was revoked by the controller; enroll again with a new token"


def test_the_unit_is_read_from_the_cgroup_only_under_systemd(tmp_path: Path) -> None:
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("0::/system.slice/tether-agent.service\n")
    assert systemd_unit({"INVOCATION_ID": "abc"}, cgroup) == "tether-agent.service"
    assert systemd_unit({}, cgroup) == ""  # a shell, a container: no unit to disable
    cgroup.write_text("12:pids:/user.slice\n0::/user.slice/user-0.slice/session-1.scope\n")
    assert systemd_unit({"INVOCATION_ID": "abc"}, cgroup) == ""


def installed(tmp_path: Path) -> tuple[Path, Path, Path, Install]:
    """A bootstrap-like layout under ``tmp_path``: /etc/tether, /opt/tether, /var/lib/tether."""
    etc, opt, state = tmp_path / "etc" / "tether", tmp_path / "opt" / "tether", tmp_path / "var" / "tether"
    for d in (etc, opt / "agent" / "b1" / "lib", opt / "bin", state / "scripts"):
        d.mkdir(parents=True)
    (etc / "agent.yaml").write_text(f"controller: c:1\ntoken_file: join-token\nstate_dir: {state}\n")
    (etc / "join-token").write_text("secret")
    (opt / "agent" / "current").symlink_to("b1")
    (state / "state.db").write_text("db")
    return etc, opt, state, Install(opt / "agent", "b1")


def test_a_reset_under_systemd_disables_the_unit_and_removes_everything(tmp_path: Path) -> None:
    etc, opt, state, install = installed(tmp_path)
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("0::/system.slice/tether-agent.service\n")
    unit = tmp_path / "tether-agent.service"
    unit.write_text("[Unit]\n")
    removal = plan_removal(
        state,
        etc / "agent.yaml",
        environ={"INVOCATION_ID": "x"},
        install=install,
        unit_file=lambda name: ADMIN_UNIT_DIR / name,
        cgroup=cgroup,
    )
    assert removal.unit == "tether-agent.service"
    assert removal.unit_file == ADMIN_UNIT_DIR / "tether-agent.service"
    assert removal.install_root == opt and removal.files == (etc / "agent.yaml", etc / "join-token")
    ran: list[tuple[str, ...]] = []

    def run(argv: Sequence[str]) -> int:
        ran.append(tuple(argv))
        return 0

    # The real unit file is not ours to remove in a test: point the removal at a copy.
    problems = remove(removal.__class__(**{**removal.__dict__, "unit_file": unit}), run)
    assert problems == []
    # No daemon-reload: it would drop the running unit's RestartPreventExitStatus= with its file.
    assert ran == [("systemctl", "disable", "--quiet", "tether-agent.service")]
    assert not unit.exists() and not opt.exists() and not etc.exists() and not state.exists()


def test_a_packaged_unit_is_disabled_but_its_file_stays(tmp_path: Path) -> None:
    etc, _, state, _ = installed(tmp_path)
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("0::/system.slice/tether-agent.service\n")
    removal = plan_removal(
        state,
        etc / "agent.yaml",
        environ={"INVOCATION_ID": "x"},
        unit_file=lambda name: Path("/usr/lib/systemd/system") / name,
        cgroup=cgroup,
    )
    assert (
        removal.unit == "tether-agent.service" and removal.unit_file is None and removal.install_root is None
    )


def test_without_systemd_only_the_state_and_the_given_config_go(tmp_path: Path) -> None:
    etc, opt, state, _ = installed(tmp_path)
    (etc / "other.conf").write_text("not ours")
    removal = plan_removal(state, etc / "agent.yaml", environ={})
    assert removal.unit == "" and removal.unit_file is None

    def run(argv: Sequence[str]) -> int:
        raise AssertionError(f"nothing to run without systemd: {argv}")

    assert remove(removal, run) == []
    assert not state.exists() and not (etc / "agent.yaml").exists() and not (etc / "join-token").exists()
    assert (etc / "other.conf").exists() and opt.exists()  # a directory with other files stays
    assert str(state) in removal.describe()
