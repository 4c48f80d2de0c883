"""e2e fixtures: real systemd-nspawn nodes with OpenSSH on a private bridge (see tests/e2e/testbed).

The tier needs root, systemd-nspawn and debootstrap (``scripts/system-deps`` installs them); without
them every e2e test is skipped with the reason. With them it always runs: the node rootfs is built on
first use (~1-2 min, cached under /var/cache/tether-testbed) before the first test starts.

Fixtures:
- ``testbed_factory(nodes=3, *, lb=False, volatile=False) -> Testbed``: a fresh testbed per call, all
  torn down at the end of the session (and checked to leave nothing behind);
- ``testbed``: one shared 3-node testbed with a load balancer, for tests that do not change the nodes;
- ``fresh_testbed(nodes=3, *, lb=False, volatile=False) -> Testbed``: testbeds removed when the test ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.testbed import rootfs
from tests.e2e.testbed.testbed import Testbed

REQUIRED_TOOLS = (
    "systemd-nspawn",
    "debootstrap",
    "ip",
    "ssh",
    "ssh-keygen",
    "nsenter",
    "apt-ftparchive",
    "dpkg-deb",
    "gpg",
    "openssl",
    "busybox",
)


def skip_reason() -> str | None:
    """Why the e2e tier cannot run here, or None."""
    if os.geteuid() != 0:
        return "e2e tier needs root (nspawn nodes, bridge, cgroups); run `sudo make test-e2e`"
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"e2e tier needs {', '.join(missing)}: run scripts/system-deps (as root)"
    if not Path("/sys/fs/cgroup").is_dir():
        return "e2e tier needs /sys/fs/cgroup"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = skip_reason()
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the node rootfs before any test (outside per-test timeouts), with progress on the terminal."""
    if session.config.option.collectonly or skip_reason() is not None:
        return
    if not any(item.get_closest_marker("e2e") for item in session.items):
        return
    capman = session.config.pluginmanager.getplugin("capturemanager")
    ctx = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    with ctx:
        rootfs.ensure()


@pytest.fixture(scope="session")
def testbed_factory(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[Callable[..., Testbed]]:
    made: list[Testbed] = []

    def make(nodes: int = 3, *, lb: bool = False, volatile: bool = False) -> Testbed:
        state = tmp_path_factory.mktemp("testbed") / "state"
        capman = pytestconfig.pluginmanager.getplugin("capturemanager")
        ctx = (
            capman.global_and_fixture_disabled()
            if capman and pytestconfig.getoption("verbose") > 0
            else contextlib.nullcontext()
        )
        with ctx:
            bed = Testbed.up(state, nodes, lb=lb, volatile=volatile)
        made.append(bed)
        return bed

    yield make
    problems = [p for bed in made for p in bed.down()]
    assert not problems, f"testbed teardown left: {problems}"


@pytest.fixture(scope="session")
def testbed(testbed_factory: Callable[..., Testbed]) -> Testbed:
    return testbed_factory(3, lb=True)


@pytest.fixture
def fresh_testbed(testbed_factory: Callable[..., Testbed]) -> Iterator[Callable[..., Testbed]]:
    """Like ``testbed_factory``, but what a test makes is removed when that test ends (a session of
    many e2e modules would otherwise keep dozens of nodes, with containerd and kubelets, running)."""
    made: list[Testbed] = []

    def make(nodes: int = 3, *, lb: bool = False, volatile: bool = False) -> Testbed:
        bed = testbed_factory(nodes, lb=lb, volatile=volatile)
        made.append(bed)
        return bed

    yield make
    problems = [p for bed in made for p in bed.down()]
    assert not problems, f"testbed teardown left: {problems}"
