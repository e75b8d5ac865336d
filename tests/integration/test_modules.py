"""Environment modules on the lab (issue 46): `lab.up --modules lmod|tcl` gives the nodes Lmod
8.6 or Environment Modules 5.2 from Debian's packages and the lab's module tree (python/3.11 off
the default PATH, cuda/12.6 and cuda/12.4), which is on no default MODULEPATH: the inventory
names it with module_path; cray-python/3.11.7 (seed 003's name) is a Python that runs only
with its module's LD_LIBRARY_PATH, as Cray's. The modules role reads each node's modules
through the MODULES fact and fails a node whose named module does not load, before anything is
changed on it.

Lab "mods" (10.186.0.0/16), 2 nodes, switched between the two module systems in place."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import DoctorOptions, ProvisionOptions, TrainOptions, VerifyOptions
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
    """ROLES "": every role of the site."""
    opts = ProvisionOptions(inventory=inv, roles=roles or None, json=True)
    rc = api.provision(opts, settings)
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
    # doctor says the same of the same node, with its fix
    api.doctor(DoctorOptions(inventory=inv, json=True, checks=("modules",)), settings)
    found = json.loads(capsys.readouterr().out)["checks"]["modules"]["findings"]
    assert {(f["node"], f["code"]) for f in found} == {
        ("worker-0", "MODULES_OK"),
        ("worker-1", "MODULE_NOT_LOADED"),
    }, found
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


# -- seed 003 end to end: the venv from the python module, ranks under the modules ------------

SCRIPT = Path(__file__).resolve().parent / "scripts" / "modules_ddp.py"
SEED_MODULES = ["cray-python/3.11.7", "cuda/12.6"]  # seed 003's own names
SEED_REQUIREMENTS = SCRIPT.parent / "seed003-requirements.txt"


@pytest.fixture(scope="module")
def seed(mods, tmp_path_factory):
    """The lab under Lmod, provisioned cold with every role as seed 003's inventory says:
    `python: python3` (the one the modules put first), its modules (cray-python's interpreter
    runs only with the LD_LIBRARY_PATH its module sets, as Cray's does), their tree, and the
    seed's requirements beside nodeprep's own."""
    info = _up(mods, "lmod")
    settings = mods[1]
    for node in info.nodes:  # cold: no env file, venv or block from an earlier test
        subprocess.run(
            ssh_argv(info, node, settings, "rm -rf ~/.nodeprep; : > ~/.bashrc"),
            check=True,
            capture_output=True,
        )
    ctl = tmp_path_factory.mktemp("modsctl")
    doc = yaml.safe_load(info.inventory.read_text())
    doc["vars"].update(
        python="python3",
        modules=SEED_MODULES,
        module_path=[TREE],
        python_requirements=["requirements/node.txt", str(SEED_REQUIREMENTS)],
        slots=2,
        controller_key=f"{ctl}/id",
        controller_ssh_config=f"{ctl}/config",
    )
    inv = tmp_path_factory.mktemp("modsinv") / "hosts.yml"
    inv.write_text(yaml.safe_dump(doc))
    return info, settings, str(inv), mods


def _train(seed, capfd, launcher: str) -> tuple[int, str]:
    info, settings, inv, _mods = seed
    code = api.train(
        TrainOptions(inventory=inv, launcher=launcher, payload=str(SCRIPT), timeout=240), settings
    )
    out = capfd.readouterr()
    return code, out.out + out.err


def test_seed_003_provisions_cold_on_the_modules_then_nothing_to_change(seed, capsys):
    info, settings, inv, _mods = seed
    rc, report = _provision(inv, settings, capsys, "")
    assert rc == 0, [
        (n, s["step"], s.get("message"))
        for n, r in report["nodes"].items()
        for s in r["steps"]
        if s["status"] == "failed"
    ]
    rc, report = _provision(inv, settings, capsys, "")
    assert rc == 0 and report["changed"] == 0, [
        (n, s["step"], s.get("message"))
        for n, r in report["nodes"].items()
        for s in r["steps"]
        if s["status"] == "changed"
    ]
    r = subprocess.run(
        ssh_argv(info, info.nodes[1], settings, "cat ~/.nodeprep/venv/pyvenv.cfg"),
        capture_output=True,
        text=True,
    )
    assert f"home = {labmods.CRAYPY}/bin" in r.stdout, r.stdout
    # that venv's python needs the module (a bare shell's cannot start it), and the modules
    # block gives every shell the module and so the seed's requirements
    r = subprocess.run(
        ssh_argv(info, info.nodes[1], settings, "env -i ~/.nodeprep/venv/bin/python -c 1"),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 127 and labmods.CRAYPY_LIB in r.stderr, r
    r = subprocess.run(
        ssh_argv(
            info,
            info.nodes[1],
            settings,
            "~/.nodeprep/venv/bin/python -c 'import tqdm, yaml; print(tqdm.__version__)'",
        ),
        capture_output=True,
        text=True,
    )
    assert r.stdout.strip() == "4.67.1", r


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed", "mpirun"])
def test_seed_003_trains_with_the_modules_loaded_in_every_rank(seed, capfd, launcher):
    code, out = _train(seed, capfd, launcher)
    assert code == 0, out
    for rank in range(4):
        assert f"modules-ddp: rank {rank}/4 ok under cuda 12.6" in out, out


def test_the_same_fleet_under_environment_modules_changes_nothing_and_trains(seed, capfd):
    """Lmod swapped for Environment Modules under the same inventory: the same modules give the
    same environment, so provision has nothing to change, and the ranks still get them."""
    info, settings, inv, mods = seed
    _up(mods, "tcl")
    rc, report = _provision(inv, settings, capfd, "")
    assert rc == 0 and report["changed"] == 0, report
    code, out = _train(seed, capfd, "deepspeed")
    assert code == 0, out
    assert out.count("modules-ddp: rank ") == 4 and "ok under cuda 12.6" in out, out


def test_a_module_that_resolves_elsewhere_on_one_node_is_drift(seed, capsys, tmp_path):
    """worker-1 finds its own cuda/12.6 first (a modulefile tree in its home, as a node with
    another site install would): verify-parity names the two CUDA_HOME values."""
    info, settings, inv, _mods = seed
    home = info.nodes[1].home
    mine = home / "mf" / "cuda"
    mine.mkdir(parents=True, exist_ok=True)
    text = (labmods.MODULEFILES / "cuda" / "12.6").read_text()
    (mine / "12.6").write_text(text.replace(str(labmods.TREE), "/opt/other"))
    subprocess.run(["chown", "-R", "--reference", str(home), str(home / "mf")], check=True)
    doc = yaml.safe_load(Path(inv).read_text())
    doc["hosts"]["worker-1"]["module_path"] = ["/home/nodeprep/mf", TREE]
    other = tmp_path / "hosts.yml"
    other.write_text(yaml.safe_dump(doc))
    api.verify_parity(VerifyOptions(inventory=str(other), json=True, port=None), settings)
    rep = json.loads(capsys.readouterr().out)
    groups = {
        d["key"]: {g["value"]: g["nodes"] for g in d["groups"]}
        for d in rep["drift"]
        if d["key"].startswith("modules.")
    }
    assert groups["modules.env.CUDA_HOME"] == {
        f"{labmods.TREE}/sw/cuda/12.6": ["worker-0"],
        "/opt/other/sw/cuda/12.6": ["worker-1"],
    }, rep["drift"]
    assert not rep["ok"]


def test_ranks_that_would_run_without_the_modules_are_named_before_anything_starts(seed, capfd):
    """worker-1's ~/.bashrc no longer reads the env file (a user's dotfiles replaced): its
    non-interactive shells load no module, so preflight names it and nothing is launched; the
    next provision puts the block back."""
    info, settings, inv, _mods = seed
    subprocess.run(
        ssh_argv(info, info.nodes[1], settings, ": > ~/.bashrc"), check=True, capture_output=True
    )
    code, out = _train(seed, capfd, "torchrun")
    assert code != 0
    assert "worker-1: ranks would run without module cray-python/3.11.7, cuda/12.6" in out, out
    assert "modules-ddp: rank" not in out, out
    rc, report = _provision(inv, settings, capfd, "")
    assert rc == 0, report
    redone = [
        s["step"]
        for s in report["nodes"]["worker-1"]["steps"]
        if s["status"] == "changed" and not s["step"].startswith(("shell:", "modules:"))
    ]
    assert redone == [], redone  # the venv still runs under the modules: not made again
    code, out = _train(seed, capfd, "torchrun")
    assert code == 0, out


def test_a_library_gone_from_the_python_module_is_not_nothing_to_change(seed, capsys):
    """cray-python's library leaves its module's lib/ (a site's upgrade half done): the venv's
    python no longer starts, though nothing nodeprep keeps changed. Provision must not say
    "nothing to change": every node fails, naming the library."""
    info, settings, inv, _mods = seed
    lib = labmods.CRAYPY / "lib" / labmods.CRAYPY_LIB
    aside = lib.with_name(lib.name + ".aside")
    lib.rename(aside)
    try:
        rc, report = _provision(inv, settings, capsys, "")
    finally:
        aside.rename(lib)
    failed = {
        n: [f"{s['step']}: {s.get('message')}" for s in r["steps"] if s["status"] == "failed"]
        for n, r in report["nodes"].items()
    }
    assert rc != 0 and report["changed"] == 0, failed
    for name, r in report["nodes"].items():
        assert r["status"] == "failed" and failed[name], (name, failed)
        assert labmods.CRAYPY_LIB in r.get("stderr_tail", ""), (name, r)
