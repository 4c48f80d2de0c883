"""Issue 13: several controller replicas in the agent's configuration (flag, YAML list, legacy single)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tether.bootstrap.layout import DEFAULT_LAYOUT, agent_config
from tether.nodeagent.config import AgentConfig, load
from tether.nodeagent.controllers import Rotation, parse_addresses, split_addresses
from tether.nodeagent.errors import ConfigError
from tether.nodeagent.identity import IdentityStore


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    os.chmod(path, 0o600)
    return path


def enrolled(state: Path, controllers: tuple[str, ...]) -> IdentityStore:
    store = IdentityStore(state)
    store.load_or_create_key()
    store.save("node-1", "demo", "worker", b"cert", b"ca", controllers=controllers)
    return store


def test_the_flag_takes_several_addresses_in_order(tmp_path: Path) -> None:
    cfg = load(None, {"controller": "10.0.0.1:7443, 10.0.0.2:7443,,10.0.0.1:7443", "state_dir": tmp_path}, {})
    assert cfg.controllers == ("10.0.0.1:7443", "10.0.0.2:7443")  # blanks and repeats dropped
    assert cfg.controller == "10.0.0.1:7443" and not cfg.controllers_remembered


def test_a_single_address_works_as_before(tmp_path: Path) -> None:
    assert load(None, {"controller": "h:1", "state_dir": tmp_path}, {}).controllers == ("h:1",)
    assert load(write(tmp_path, "controller: h:2\n"), {"state_dir": tmp_path}, {}).controllers == ("h:2",)


def test_a_yaml_list_and_the_legacy_key_together(tmp_path: Path) -> None:
    path = write(tmp_path, "controller: a:1\ncontrollers:\n  - b:2\n  - c:3\n  - a:1\n")
    assert load(path, {"state_dir": tmp_path}, {}).controllers == ("a:1", "b:2", "c:3")
    only_list = write(tmp_path, "controllers: [b:2, c:3]\n")
    cfg = load(only_list, {"state_dir": tmp_path}, {})
    assert (cfg.controller, cfg.controllers) == ("b:2", ("b:2", "c:3"))


def test_the_flag_replaces_both_settings_of_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "controller: a:1\ncontrollers: [b:2]\n")
    assert load(path, {"controller": "x:9,y:8", "state_dir": tmp_path}, {}).controllers == ("x:9", "y:8")


def test_each_bad_address_is_reported_on_its_own(tmp_path: Path) -> None:
    path = write(tmp_path, "controllers: [good:1, nohost, 7, 'h:99999']\n")
    with pytest.raises(ConfigError) as err:
        load(path, {"controller": None, "state_dir": tmp_path}, {})
    text = str(err.value)
    assert "controllers: invalid address 'nohost'" in text
    assert "controllers: 7 is not a HOST:PORT string" in text
    assert "controllers: invalid address 'h:99999'" in text
    assert "good:1" not in text
    with pytest.raises(ConfigError) as err:
        load(None, {"controller": "a:1,b", "state_dir": tmp_path}, {})
    assert "controller: invalid address 'b': expected HOST:PORT" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, "controllers: {a: 1}\n"), {"state_dir": tmp_path}, {})
    assert "controllers: expected HOST:PORT, a comma-separated list or a YAML list" in str(err.value)


def test_an_enrolled_agent_uses_every_remembered_address(tmp_path: Path) -> None:
    enrolled(tmp_path / "agent", ("b:2", "a:1"))
    cfg = load(None, {"state_dir": tmp_path / "agent"}, {})
    assert cfg.controllers == ("b:2", "a:1") and cfg.controllers_remembered
    assert not load(None, {"state_dir": tmp_path / "agent", "controller": "c:3"}, {}).controllers_remembered


def test_a_damaged_remembered_address_is_a_configuration_error(tmp_path: Path) -> None:
    enrolled(tmp_path / "agent", ("a:1", "garbage"))
    with pytest.raises(ConfigError) as err:
        load(None, {"state_dir": tmp_path / "agent"}, {})
    assert "node.json: invalid address 'garbage'" in str(err.value)


def test_the_config_object_keeps_controller_and_controllers_in_step() -> None:
    assert AgentConfig(controller="a:1").controllers == ("a:1",)
    assert AgentConfig(controllers=("b:2", "c:3")).controller == "b:2"
    assert AgentConfig(controller="a:1", controllers=("b:2", "a:1")).controllers == ("a:1", "b:2")


def test_split_addresses_for_the_bootstrap_and_the_controller() -> None:
    assert split_addresses("a:1,b:2") == ("a:1", "b:2")
    with pytest.raises(ValueError, match="invalid address 'b'"):
        split_addresses("a:1,b")
    with pytest.raises(ValueError, match="no address given"):
        split_addresses(" , ")
    assert parse_addresses(None) == ((), [])


def test_rotation_wraps_and_a_welcome_list_becomes_the_order() -> None:
    rotation = Rotation(("lb:1", "a:1"), ("c:3", "a:1"))
    assert rotation.addresses == ("lb:1", "a:1", "c:3")
    assert [rotation.current, rotation.advance(), rotation.advance(), rotation.advance()] == [
        "lb:1",
        "a:1",
        "c:3",
        "lb:1",
    ]
    assert not rotation.welcomed(())  # nothing listed: keep what there is
    assert rotation.current == "lb:1"
    assert rotation.welcomed(("b:2", "c:3"))
    # The replica that welcomed first; the operator's addresses stay, last, as a last resort.
    assert rotation.addresses == ("b:2", "c:3", "lb:1", "a:1")
    assert rotation.current == "b:2" and rotation.advance() == "c:3"
    assert rotation.remembered() == ("c:3", "b:2", "lb:1", "a:1")
    with pytest.raises(ValueError, match="no controller address"):
        Rotation(())


def test_the_bootstrap_writes_several_addresses_the_agent_reads_back(tmp_path: Path) -> None:
    def written(controller: str) -> Path:
        text = agent_config(
            DEFAULT_LAYOUT, controller=controller, ca_hash="", node_name="n", environment="e", role="worker"
        )
        return write(tmp_path, text.decode())

    several = written("10.0.0.1:7443,10.0.0.2:7443")
    assert yaml.safe_load(several.read_text())["controllers"] == ["10.0.0.1:7443", "10.0.0.2:7443"]
    overrides = {"state_dir": tmp_path, "token_file": None}
    assert load(several, overrides, {}).controllers == ("10.0.0.1:7443", "10.0.0.2:7443")
    one = written("10.0.0.1:7443")
    assert yaml.safe_load(one.read_text())["controller"] == "10.0.0.1:7443"  # as before
    assert "controllers" not in yaml.safe_load(one.read_text())
    with pytest.raises(ValueError, match="invalid address"):
        written("10.0.0.1")
