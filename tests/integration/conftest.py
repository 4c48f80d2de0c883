"""Fixtures: a real controller subprocess on 127.0.0.1 port 0 and real agent subprocesses."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.harness import Agent, Controller, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    c = Controller(tmp_path)
    c.start()
    yield c
    c.kill()


@pytest.fixture
def agents(tmp_path: Path, controller: Controller) -> Iterator[Callable[[str], Agent]]:
    made: list[Agent] = []

    def make(name: str) -> Agent:
        a = Agent(tmp_path, name, controller)
        made.append(a)
        return a

    yield make
    for a in made:
        a.kill()


def apply_env(controller: Controller, tmp_path: Path, name: str, templates: str) -> None:
    doc = tmp_path / f"{name}.yaml"
    doc.write_text(
        "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\n"
        f"metadata:\n  name: {name}\nspec:\n  customTemplates:\n{templates}"
    )
    controller.ctl("env", "apply", "-f", str(doc))


def token(controller: Controller, env: str, *extra: str) -> str:
    out = controller.ctl("token", "create", "--env", env, "--role", "worker", *extra).stdout.strip()
    assert "\n" not in out
    return out


def ca_hash(controller: Controller) -> str:
    return str(yaml.safe_load(controller.config.read_text())["caHash"])


def nodes(controller: Controller) -> dict[str, dict[str, object]]:
    return {n["name"]: n for n in json.loads(controller.ctl("node", "list", "-o", "json").stdout)}


def events(controller: Controller, node: str) -> list[dict[str, object]]:
    return json.loads(controller.ctl("events", "--node", node, "-o", "json").stdout)  # type: ignore[no-any-return]


def wait_state(controller: Controller, names: list[str], state: str, timeout: float = 60) -> None:
    def check() -> bool:
        current = nodes(controller)
        return all(current.get(n, {}).get("state") == state for n in names)

    wait_for(check, timeout, what=f"{names} to be {state}")
