"""Inventories: tether's format with defaults, holodeck Environment documents, every problem at once."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tether.bootstrap import inventory
from tether.bootstrap.errors import InventoryError
from tether.bootstrap.inventory import Entry


def test_defaults_flags_and_per_node_values_merge_in_that_order(tmp_path: Path) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "defaults": {"env": "lab", "role": "worker", "user": "ops", "identity": "~/.ssh/k"},
                "nodes": [
                    {"ssh": "10.0.0.5", "name": "gpu-1"},
                    {"ssh": "root@10.0.0.6:2222", "role": "control-plane", "host_key": "ssh-ed25519 AAAA"},
                    {"ssm": "i-0abc", "region": "eu-west-1"},
                ],
            }
        )
    )
    flags = Entry(env="from-flags", known_hosts="/kh", region="us-east-1")
    entries = inventory.load(path, flags)
    assert [e.target for e in entries] == ["ops@10.0.0.5", "root@10.0.0.6:2222", "ssm:i-0abc"]
    assert entries[0].env == "lab"  # the file's defaults beat the flags
    assert entries[0].known_hosts == "/kh"  # flags fill what the file leaves open
    assert entries[1].role == "control-plane" and entries[1].identity == "~/.ssh/k"
    assert entries[2].region == "eu-west-1"


def test_every_problem_is_reported_at_once() -> None:
    doc = {
        "defaults": {"colour": "blue"},
        "nodes": [
            {"ssh": "a@b:99999"},
            {"ssh": "h1", "ssm": "i-1"},
            {"ssm": "i-2"},
            {"ssh": "h2", "role": "boss"},
            {"ssh": "h3", "name": "x"},
            {"ssh": "h4", "name": "x", "host_key": "ssh-ed25519 A", "accept_new_host_key": True},
            {"ssh": "h3"},
            "not-a-mapping",
        ],
    }
    with pytest.raises(InventoryError) as err:
        inventory.parse(doc, "inv.yaml", Entry())
    text = "\n".join(err.value.problems)
    for phrase in (
        "defaults.colour: unknown setting",
        "nodes[0].ssh: invalid SSH port",
        "nodes[1]: give exactly one",
        "nodes[2]: an ssm node needs a region",
        "nodes[3].role: unknown role 'boss'",
        "nodes[5]: node name 'x' also used by nodes[4]",
        "exclude each other",
        "root@h3 is also nodes[4]",
        "nodes[7]: expected a mapping",
    ):
        assert phrase in text


def test_an_environment_document_contributes_its_node_list() -> None:
    doc = {
        "apiVersion": "holodeck.nvidia.com/v1alpha1",
        "kind": "Environment",
        "metadata": {"name": "gpu-cluster"},
        "spec": {
            "auth": {"username": "ubuntu", "privateKey": "~/.ssh/aws.pem"},
            "cluster": {"region": "us-west-2"},
        },
        "status": {
            "cluster": {
                "nodes": [
                    {"name": "cp-0", "role": "control-plane", "publicIp": "3.3.3.3", "sshUsername": "rocky"},
                    {"name": "w-0", "role": "worker", "privateIp": "10.0.1.7"},
                    {"name": "w-1", "role": "worker", "instanceId": "i-0def"},
                ]
            }
        },
    }
    entries = inventory.parse(doc, "env.yaml", Entry())
    assert [(e.name, e.role, e.target, e.env) for e in entries] == [
        ("cp-0", "control-plane", "rocky@3.3.3.3", "gpu-cluster"),
        ("w-0", "worker", "ubuntu@10.0.1.7", "gpu-cluster"),
        ("w-1", "worker", "ssm:i-0def", "gpu-cluster"),
    ]
    assert entries[0].identity == "~/.ssh/aws.pem"
    assert entries[2].region == "us-west-2"


def test_a_single_host_environment_and_an_empty_one() -> None:
    single = {
        "kind": "Environment",
        "metadata": {"name": "one"},
        "spec": {"provider": "ssh", "instance": {"hostUrl": "host.example.com"}, "auth": {"username": "me"}},
    }
    assert [e.target for e in inventory.parse(single, "e", Entry())] == ["me@host.example.com"]
    with pytest.raises(InventoryError, match="lists no nodes"):
        inventory.parse({"kind": "Environment", "spec": {}}, "e", Entry())


def test_a_file_of_several_documents_is_read_for_its_one_environment(tmp_path: Path) -> None:
    env = {
        "apiVersion": "holodeck.nvidia.com/v1alpha1",
        "kind": "Environment",
        "metadata": {"name": "lab"},
        "spec": {"auth": {"username": "ubuntu", "privateKey": "~/.ssh/k"}},
        "status": {"cluster": {"nodes": [{"name": "w-0", "role": "worker", "privateIp": "10.0.1.7"}]}},
    }
    path = tmp_path / "env.yaml"
    path.write_text(yaml.safe_dump_all([{"kind": "ConfigMap", "metadata": {"name": "x"}}, env]))
    notes: list[str] = []
    entries = inventory.load(path, Entry(), notes)
    assert [(e.name, e.target, e.env) for e in entries] == [("w-0", "ubuntu@10.0.1.7", "lab")]
    assert any("document 2 is the Environment" in n for n in notes)
    path.write_text(yaml.safe_dump_all([env, env]))
    with pytest.raises(InventoryError, match=r"2 are Environments \(documents 1, 2\): give one Environment"):
        inventory.load(path, Entry())


def test_documents_are_picked_by_the_spec_loaders_rule(tmp_path: Path) -> None:
    # `Kind:` in any case names the Environment, as `tetherctl env apply` reads it.
    env = {
        "Kind": "Environment",
        "metadata": {"name": "lab"},
        "spec": {"auth": {"username": "ubuntu"}},
        "status": {"cluster": {"nodes": [{"name": "w-0", "privateIp": "10.0.1.7"}]}},
    }
    path = tmp_path / "env.yaml"
    path.write_text(yaml.safe_dump_all([{"kind": "ConfigMap"}, env]))
    notes: list[str] = []
    assert [e.target for e in inventory.load(path, Entry(), notes)] == ["ubuntu@10.0.1.7"]
    assert notes[0].startswith(f"{path}: the file holds 2 documents; document 2 is the Environment")
    assert "stored with the Environment" in notes[0]
    path.write_text(yaml.safe_dump_all([{"kind": "ConfigMap"}, {"nodes": []}]))
    with pytest.raises(InventoryError, match=r"none is an Environment: document 1 \(kind ConfigMap\)"):
        inventory.load(path, Entry())


def test_the_yaml_limits_hold_for_an_inventory_file(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    path = tmp_path / "inv.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InventoryError, match="nodes, aliases expanded"):
        inventory.load(path, Entry())
    path.write_text("a: &a x\n---\nnodes: &a [*a]\n")  # an alias inside its own node
    with pytest.raises(InventoryError, match="inside the node it names"):
        inventory.load(path, Entry())
