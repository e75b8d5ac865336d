"""Two inventory nodes on one machine (the single-box recipe, a big box split in two) get
disjoint GPUs: what train runs for them, and what it refuses, without ssh."""
from __future__ import annotations

import pytest

from nodeprep.commands import train as T
from nodeprep.commands.options import TrainOptions
from nodeprep.engine.events import Events
from nodeprep.engine.facts import FactValues
from nodeprep.errors import InputError
from nodeprep.inventory import load
from nodeprep.ops.provision.topology import Topology, gpu_shares


@pytest.fixture
def inv(tmp_path):
    p = tmp_path / "hosts.yml"
    p.write_text("vars:\n  user: ops\nhosts:\n  half0: {address: 127.0.0.1}\n  half1: {address: localhost}\n"
                 "  other: {address: 10.0.0.6}\n")
    return load(str(p))


def facts(machine: str, gpus: int):
    return FactValues({"gpus": {"count": gpus}, "identity": {"machine": machine, "home": machine}})


def job(inv, launcher, limit="half0,half1,other", gpus=4):
    hosts = inv.select(limit)
    j = T.Job(TrainOptions(None, limit, launcher, "health"), inv, hosts, Events())
    j.python, j.job_dir = "/home/ops/.nodeprep/venv/bin/python", "/home/ops/.nodeprep/jobs/payloads"
    j.facts = {"half0": facts("box", gpus), "half1": facts("box", gpus), "other": facts("other", gpus)}
    names = [h.name for h in hosts]
    j.shares = gpu_shares(Topology.of(j.facts, names), names, {n: j.facts[n]["gpus"]["count"] for n in names})
    return j


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
    assert "export CUDA_VISIBLE_DEVICES=0,1; " in cmds["half0"] and "--nproc-per-node=2" in cmds["half0"]
    assert "export CUDA_VISIBLE_DEVICES=2,3; " in cmds["half1"]


def test_refused_shapes(inv):
    j = job(inv, "mpirun")
    assert any("would share GPUs under mpirun" in p for p in j._share_problems(
        Topology.of(j.facts, ["half0", "half1", "other"])))
    with pytest.raises(InputError, match="3 GPU.*do not split evenly over 2 nodes"):
        job(inv, "deepspeed", gpus=3)


def test_cpu_machines_and_lone_nodes_are_not_split(inv):
    assert job(inv, "deepspeed", gpus=0).shares == {}
    assert job(inv, "deepspeed", limit="half0,other").shares == {}


def test_venv_paths_that_differ_by_group(inv):
    """torchrun starts each node's own interpreter in its own job dir; the others refuse."""
    got = {n: FactValues({"user": {"home": "/home/ops"}, "gpus": {"count": 0}}) for n in ("half0", "half1")}
    j = job(inv, "torchrun", limit="half0,half1", gpus=0)
    j.vars["half1"]["venv_path"] = "~/.nodeprep/venv-aarch64"
    assert j._paths(got, ["half0", "half1"]) == []
    cmds = j.commands()
    assert "/home/ops/.nodeprep/venv/bin/python -m torch.distributed.run" in cmds["half0"]
    assert "/home/ops/.nodeprep/venv-aarch64/bin/python -m torch.distributed.run" in cmds["half1"]
    j = job(inv, "deepspeed", limit="half0,half1", gpus=0)
    j.vars["half1"]["venv_path"] = "~/.nodeprep/venv-aarch64"
    problem, = j._paths(got, ["half0", "half1"])
    assert "DeepSpeed needs one path" in problem and "--launcher torchrun" in problem
