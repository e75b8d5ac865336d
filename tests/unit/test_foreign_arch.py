"""Fleets of two CPU platforms, as decisions and files: lab --arch values, the lab inventory
of a mixed fleet, the torch plan when each platform pins its own release (aarch64 CPU nodes
from PyPI's plain-version wheel), and the torch role's version match. The lab itself is
tested in tests/integration/test_aarch64.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from nodeprep.errors import InputError, NodeprepError
from nodeprep.lab import foreign, lab_inventory
from nodeprep.ops import torchplan
from nodeprep.ops.provision import roles as roles_mod
from nodeprep.ops.pystack.runcache import _releases_by_platform

NAMES = ["worker-0", "worker-1", "worker-2"]


@pytest.mark.parametrize(
    "values,previous,want",
    [
        (("aarch64",), None, {0: "aarch64", 1: "aarch64", 2: "aarch64"}),
        (("worker-1=aarch64",), None, {1: "aarch64"}),
        (("aarch64", "worker-2=native"), None, {0: "aarch64", 1: "aarch64"}),
        (("aarch64", f"worker-0={foreign.NATIVE}"), None, {1: "aarch64", 2: "aarch64"}),
        (
            None,
            {"1": "aarch64", "7": "aarch64"},
            {1: "aarch64"},
        ),  # kept; nodes past the count dropped
        ((), {"1": "aarch64"}, {}),
    ],
)
def test_arch_values(values, previous, want):
    assert foreign.parse(values, previous, 3, NAMES) == want


@pytest.mark.parametrize(
    "values,match",
    [
        (("riscv64",), "unknown architecture 'riscv64'"),
        (("worker-9=aarch64",), "no node 'worker-9'"),
    ],
)
def test_bad_arch_values_are_one_line_input_errors(values, match):
    with pytest.raises(InputError, match=match):
        foreign.parse(values, None, 3, NAMES)


def test_a_running_node_keeps_its_architecture():
    state = {"nodes": 2, "arch": {"1": "aarch64"}}
    with pytest.raises(InputError, match="worker-0 runs another architecture"):
        foreign.node_arches("dr", ("aarch64",), state, True, 2, NAMES[:2])
    # a new node may take one while the lab runs (the values given are the whole answer);
    # with the lab down any node may change
    assert foreign.node_arches(
        "dr", ("worker-1=aarch64", "worker-2=aarch64"), state, True, 3, NAMES
    ) == {1: "aarch64", 2: "aarch64"}
    assert foreign.node_arches("dr", ("aarch64",), state, False, 2, NAMES[:2]) == {
        0: "aarch64",
        1: "aarch64",
    }


@pytest.mark.parametrize("lab_dir", ["/srv/labs,1/dr", "/srv/a:b/dr", "/srv/a\\b/dr"])
def test_a_lab_directory_an_overlay_cannot_name_is_refused_for_foreign_nodes(lab_dir):
    with pytest.raises(InputError, match="overlay mount's options cannot name") as e:
        foreign.mountable("dr", Path(lab_dir), {1: "aarch64"})
    assert "nodeprep.lab_root" in e.value.hint
    # native nodes mount no overlay: the same directory is fine for them
    foreign.mountable("dr", Path(lab_dir), {})
    foreign.mountable("dr", Path("/var/lib/nodeprep/labs/dr"), {1: "aarch64"})


def test_mixed_lab_inventory_pins_the_aarch64_release_per_host():
    text = lab_inventory.inventory_text(
        "nodeprep",
        Path("/lab/id"),
        [("worker-0", "10.1.0.10", 22, "aarch64"), ("worker-1", "10.1.0.11", 22)],
    )
    inv = yaml.safe_load(text)
    assert inv["hosts"]["worker-0"] == {
        "address": "10.1.0.10",
        "port": 22,
        "torch_version": "2.8.0",
    }
    assert inv["hosts"]["worker-1"] == {"address": "10.1.0.11", "port": 22}
    assert inv["vars"]["torch_index"] == "pip-config"
    assert "torch_version" not in lab_inventory.inventory_text(
        "u", Path("/k"), [("a", "10.1.0.10", 22)]
    )


def _cpu(name, arch):
    return torchplan.NodeGPU(name, arch, None, capabilities=[], cpu_only=True)


def test_pip_config_pins_pypis_aarch64_cpu_wheel_by_its_plain_version():
    plan = torchplan.choose("2.8.0", [_cpu("a", "aarch64")])
    notes = torchplan.from_pip_config(plan)
    b = plan.for_arch("aarch64")
    assert b.requirement == "torch==2.8.0" and b.index_url is None
    assert "PyPI's aarch64 wheel of 2.8 is the CPU build" in notes[0]
    # from 2.11 PyPI's aarch64 wheel is a CUDA build: the +cpu pin stays, the note says why
    plan = torchplan.choose("2.13.0", [_cpu("a", "aarch64")])
    notes = torchplan.from_pip_config(plan)
    assert plan.for_arch("aarch64").requirement == "torch==2.13.0+cpu"
    assert "CUDA build" in notes[0] and "2.10.0 or older" in notes[0]
    # x86_64 keeps its +cpu pin from pip's configuration (this machine's find-links)
    plan = torchplan.choose("2.13.0", [_cpu("b", "x86_64")])
    assert (
        torchplan.from_pip_config(plan) == []
        and plan.for_arch("x86_64").requirement == "torch==2.13.0+cpu"
    )


def test_a_plan_of_two_releases_one_per_platform():
    plan = torchplan.merged(
        [
            torchplan.choose("2.13.0", [_cpu("b", "x86_64")]),
            torchplan.choose("2.8.0", [_cpu("a", "aarch64")]),
        ]
    )
    assert plan.for_arch("x86_64").requirement == "torch==2.13.0+cpu"
    assert plan.for_arch("aarch64").requirement == "torch==2.8.0+cpu"
    assert "torch differs per platform" in plan.warning


def _prov(versions: dict, arches: dict):
    return SimpleNamespace(
        vars={n: {"torch_version": v} for n, v in versions.items()},
        origin=lambda node, key: ("hosts.yml", 7),
    ), [_cpu(n, arches[n]) for n in versions]


def test_one_release_per_platform():
    prov, nodes = _prov(
        {"a": "2.8.0", "b": "2.8.0", "c": "2.13.0"}, {"a": "aarch64", "b": "aarch64", "c": "x86_64"}
    )
    got = _releases_by_platform(prov, nodes)
    assert {v: [n.name for n in g] for v, g in got.items()} == {
        "2.8.0": ["a", "b"],
        "2.13.0": ["c"],
    }
    # a node naming no release takes its platform's
    prov, nodes = _prov(
        {"a": "2.8.0", "b": None, "c": "2.13.0"}, {"a": "aarch64", "b": "aarch64", "c": "x86_64"}
    )
    got = _releases_by_platform(prov, nodes)
    assert {v: [n.name for n in g] for v, g in got.items()} == {
        "2.8.0": ["a", "b"],
        "2.13.0": ["c"],
    }
    prov, nodes = _prov({"a": "2.8.0", "b": "2.7.1"}, {"a": "aarch64", "b": "aarch64"})
    with pytest.raises(
        NodeprepError,
        match=r"torch_version differs between aarch64 nodes \(2.7.1 on b, 2.8.0 on a\)",
    ):
        _releases_by_platform(prov, nodes)


def test_a_plain_pin_matches_a_local_build_of_it():
    matches = next(
        r for r in roles_mod.load("torch", Path(__file__).parents[2] / "roles")
    ).module.matches
    assert matches("2.8.0+cpu", "2.8.0") and matches("2.13.0+cpu", "2.13.0+cpu")
    assert not matches("2.13.0+cu130", "2.13.0+cpu") and not matches("2.8.1", "2.8.0")
    assert not matches(None, "2.8.0") and not matches("2.8.0", "2.8.0+cpu")
