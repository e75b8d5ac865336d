"""Two inventory nodes on one machine (the single-box recipe, a big box split in two) get
disjoint GPUs: what train runs for them, and what it refuses, without ssh."""

from __future__ import annotations

import pytest

from nodeprep.commands.options import TrainOptions
from nodeprep.commands.train.prepare import plan_of
from nodeprep.engine.facts import FactValues
from nodeprep.errors import InputError
from nodeprep.inventory import load


@pytest.fixture
def inv(tmp_path):
    p = tmp_path / "hosts.yml"
    p.write_text(
        "vars:\n  user: ops\nhosts:\n  half0: {address: 127.0.0.1}\n  half1: {address: localhost}\n"
        "  other: {address: 10.0.0.6}\n"
    )
    return load(str(p))


def facts(machine: str, gpus: int):
    return FactValues(
        {
            "gpus": {"count": gpus},
            "identity": {"machine": machine, "home": machine},
            "user": {"home": "/home/ops"},
        }
    )


def job(inv, launcher, limit="half0,half1,other", gpus=4, venvs=None):
    """The LaunchPlan train builds from these facts (VENVS: node -> its venv_path)."""
    hosts = inv.select(limit)
    got = {"half0": facts("box", gpus), "half1": facts("box", gpus), "other": facts("other", gpus)}
    vars_of = {h.name: {n: inv.var(h, n) for n in inv.schema} for h in hosts}
    for node, venv in (venvs or {}).items():
        vars_of[node]["venv_path"] = venv
    return plan_of(
        TrainOptions(inventory=None, limit=limit, launcher=launcher, payload="health"),
        "job1",
        hosts,
        {h.name: got[h.name] for h in hosts},
        vars_of,
    )[0]


def test_nodes_on_one_machine_split_its_gpus(inv):
    j = job(inv, "deepspeed")
    assert j.shares == {"half0": [0, 1], "half1": [2, 3]}
    cmd = j.commands()["half0"]
    assert "--include half0:0,1@half1:2,3@other:0,1,2,3" in cmd
    # the hostfile gives each node all of its machine's GPUs: --include ids must be below it
    assert "half0 slots=4\nhalf1 slots=4\nother slots=4" in cmd


def test_torchrun_needs_equal_shares_and_sets_visible_devices(inv):
    with pytest.raises(InputError, match="same number of processes on every node"):
        job(inv, "torchrun").commands()
    cmds = job(inv, "torchrun", limit="half0,half1").commands()
    assert (
        "export CUDA_VISIBLE_DEVICES=0,1; " in cmds["half0"]
        and "--nproc-per-node=2" in cmds["half0"]
    )
    assert "export CUDA_VISIBLE_DEVICES=2,3; " in cmds["half1"]


def test_refused_shapes(inv):
    j = job(inv, "mpirun")
    assert any("would share GPUs under mpirun" in p for p in j.share_problems())
    with pytest.raises(InputError, match="3 GPU.*do not split evenly over 2 nodes"):
        job(inv, "deepspeed", gpus=3)


def test_cpu_machines_and_lone_nodes_are_not_split(inv):
    assert job(inv, "deepspeed", gpus=0).shares == {}
    assert job(inv, "deepspeed", limit="half0,other").shares == {}


def test_venv_paths_that_differ_by_group(inv):
    """torchrun starts each node's own interpreter in its own job dir; the others refuse."""
    aarch64 = {"half1": "~/.nodeprep/venv-aarch64"}
    j = job(inv, "torchrun", limit="half0,half1", gpus=0, venvs=aarch64)
    assert j.path_problems() == []
    cmds = j.commands()
    assert "/home/ops/.nodeprep/venv/bin/python -m torch.distributed.run" in cmds["half0"]
    assert "/home/ops/.nodeprep/venv-aarch64/bin/python -m torch.distributed.run" in cmds["half1"]
    j = job(inv, "deepspeed", limit="half0,half1", gpus=0, venvs=aarch64)
    (problem,) = j.path_problems()
    assert "DeepSpeed needs one path" in problem and "--launcher torchrun" in problem
