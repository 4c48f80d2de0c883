"""Issue 12: an enrolled agent needs only its state directory; it remembers its controller(s)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tether.nodeagent.config import load
from tether.nodeagent.errors import ConfigError
from tether.nodeagent.identity import IdentityStore


def _enrolled(state: Path, controllers: tuple[str, ...]) -> IdentityStore:
    store = IdentityStore(state)
    store.load_or_create_key()
    store.save("node-1", "demo", "worker", b"cert", b"ca", controllers=controllers)
    return store


def test_the_enrolled_address_is_kept_and_used_when_none_is_given(tmp_path: Path) -> None:
    _enrolled(tmp_path / "agent", ("10.0.0.1:7443",))
    meta = json.loads((tmp_path / "agent" / "node.json").read_text())
    assert meta["controllers"] == ["10.0.0.1:7443"]
    assert (tmp_path / "agent" / "node.json").stat().st_mode & 0o077 == 0
    cfg = load(None, {"state_dir": tmp_path / "agent"}, {})
    assert cfg.controller == "10.0.0.1:7443"


def test_a_flag_and_a_config_file_win_over_the_remembered_address(tmp_path: Path) -> None:
    _enrolled(tmp_path / "agent", ("10.0.0.1:7443",))
    assert load(None, {"state_dir": tmp_path / "agent", "controller": "h:2"}, {}).controller == "h:2"
    conf = tmp_path / "agent.yaml"
    conf.write_text(f"controller: h:3\nstate_dir: {tmp_path / 'agent'}\n")
    assert load(conf, {}, {}).controller == "h:3"
    assert load(conf, {"controller": "h:4"}, {}).controller == "h:4"


def test_not_enrolled_and_no_address_says_where_it_would_be_remembered(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load(None, {"state_dir": tmp_path / "fresh"}, {})
    assert "controller: required" in str(err.value)
    assert str(tmp_path / "fresh" / "node.json") in str(err.value)


def test_an_address_that_answered_moves_first_and_the_others_stay(tmp_path: Path) -> None:
    store = _enrolled(tmp_path / "agent", ("a:1", "b:2"))
    store.remember_controller("b:2")
    assert store.controllers() == ("b:2", "a:1")
    store.remember_controller("c:3")
    assert store.controllers() == ("c:3", "b:2", "a:1")
    assert store.load().node_name == "node-1"  # the rest of node.json is untouched
    assert load(None, {"state_dir": tmp_path / "agent"}, {}).controller == "c:3"


def test_state_from_before_controllers_were_kept_has_none(tmp_path: Path) -> None:
    state = tmp_path / "agent"
    store = _enrolled(state, ())
    (state / "node.json").write_text(json.dumps({"node_name": "n", "environment": "e", "role": "r"}))
    assert store.controllers() == ()
    store.remember_controller("h:1")
    assert store.controllers() == ("h:1",)
