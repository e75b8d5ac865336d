"""Environment modules on the lab (issue 46): `lab.up --modules lmod|tcl` gives the nodes Lmod
8.6 or Environment Modules 5.2 from Debian's packages and the lab's module tree (python/3.11 off
the default PATH, cuda/12.6 and cuda/12.4), which is on no default MODULEPATH: the inventory
names it with module_path. The modules role reads each node's modules through the MODULES fact
and fails a node whose named module does not load, before anything is changed on it.

Lab "mods" (10.186.0.0/16), 2 nodes, switched between the two module systems in place."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import ProvisionOptions
from nodeprep.lab import modules as labmods

from .conftest import ssh_argv

NAME, SUBNET, NODES = "mods", 186, 2
TREE = str(labmods.MODULEFILES)


@pytest.fixture(scope="module")
def mods(tmp_path_factory, own_settings):
    base = tmp_path_factory.mktemp("mods")
    settings = own_settings(base, lock_wait=60)
    labmod.down(NAME, settings, log=lambda m: None)
    yield base, settings
    labmod.down(NAME, settings, log=lambda m: None, purge=True)


def _up(mods, system: str):
    base, settings = mods
    return labmod.up(
        NODES,
        NAME,
        settings,
        labmod.UpOptions(inventory_dir=base / "inv", subnet=SUBNET, modules=system),
        log=lambda m: None,
    )


def _inventory(info, path, per_host: dict) -> str:
    """The lab's inventory with module_path for all and each host's own `modules`."""
    doc = yaml.safe_load(info.inventory.read_text())
    doc["vars"]["module_path"] = [TREE]
    for host, mods in per_host.items():
        doc["hosts"][host]["modules"] = mods
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _provision(inv: str, settings, capsys, roles: str) -> tuple[int, dict]:
    rc = api.provision(ProvisionOptions(inventory=inv, roles=roles, json=True), settings)
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("system", ["lmod", "tcl"])
def test_a_module_missing_on_one_node_is_named_and_nothing_changes_there(
    mods, system, capsys, tmp_path
):
    info = _up(mods, system)
    settings = mods[1]
    for node in info.nodes:  # a node as it came: no env file, no block in ~/.bashrc
        subprocess.run(
            ssh_argv(info, node, settings, "rm -rf ~/.nodeprep/env.sh; : > ~/.bashrc"),
            check=True,
            capture_output=True,
        )
    inv = _inventory(
        info,
        tmp_path / "hosts.yml",
        {"worker-0": ["python/3.11", "cuda/12.6"], "worker-1": ["python/3.11", "cuda/12.8"]},
    )
    rc, report = _provision(inv, settings, capsys, "modules,shell")
    assert rc != 0
    bad = report["nodes"]["worker-1"]
    assert bad["status"] == "failed", bad
    failed = [s for s in bad["steps"] if s["status"] == "failed"]
    assert failed and failed[0]["step"] == "modules: modules.load python/3.11 cuda/12.8"
    assert "module cuda/12.8 not available (cuda/12.4, cuda/12.6 are)" in failed[0]["message"]
    assert not any(s["status"] == "changed" for s in bad["steps"]), bad["steps"]
    r = subprocess.run(
        ssh_argv(info, info.nodes[1], settings, "cat ~/.bashrc"), capture_output=True, text=True
    )
    assert r.stdout == "", r.stdout  # nothing was written on the failed node
    good = report["nodes"]["worker-0"]
    assert good["status"] == "changed", good  # the other node went on
    # the same inventory with a module the node has: both pass, the second run changes nothing
    inv = _inventory(
        info,
        tmp_path / "hosts.yml",
        {"worker-0": ["python/3.11", "cuda/12.6"], "worker-1": ["python/3.11", "cuda/12.6"]},
    )
    rc, report = _provision(inv, settings, capsys, "modules,shell")
    assert rc == 0, report
    rc, report = _provision(inv, settings, capsys, "modules,shell")
    assert rc == 0 and report["changed"] == 0, report
