"""`train --emulate`: what the job runs for (K GPUs, M emulated nodes) without ssh: the alias
block, the DeepSpeed hostfile + --include, one torchrun per emulated node with its own
CUDA_VISIBLE_DEVICES, and the combinations that are refused."""

from __future__ import annotations

import shlex

import pytest

from nodeprep.commands.options import TrainOptions
from nodeprep.commands.train.prepare import plan_of
from nodeprep.engine.facts import FactValues
from nodeprep.errors import InputError
from nodeprep.inventory import model as inventory
from nodeprep.ops.train import emulate as E


@pytest.fixture
def inv(tmp_path):
    p = tmp_path / "hosts.yml"
    p.write_text(
        "vars:\n  user: ops\nhosts:\n  gpubox: {address: 10.0.0.5, port: 2222}\n"
        "  other: {address: 10.0.0.6}\n"
    )
    return inventory.load(str(p))


def job(inv, launcher, gpus, m, network=False):
    """The LaunchPlan train builds for one machine with GPUS emulated as M nodes."""
    hosts = inv.select("gpubox")
    opts = TrainOptions(
        inventory=None,
        limit=None,
        launcher=launcher,
        payload="health",
        args=("--x", "a b"),
        timeout=None,
        max_restarts=0,
        port=29500,
        ds_launcher="pdsh",
        preflight=True,
        emulate=m,
        emulate_network=network,
    )
    got = {"gpubox": FactValues({"gpus": {"count": gpus}, "user": {"home": "/home/ops"}})}
    vars_of = {h.name: {n: inv.var(h, n) for n in inv.schema} for h in hosts}
    return plan_of(
        opts, "job1", hosts, got, vars_of, E.emulation_of(hosts[0], m, gpus, launcher, network)
    )[0]


@pytest.mark.parametrize(
    "gpus,m,include",
    [
        (2, 2, "emu-0:0@emu-1:1"),
        (4, 2, "emu-0:0,1@emu-1:2,3"),
        (8, 4, "emu-0:0,1@emu-1:2,3@emu-2:4,5@emu-3:6,7"),
    ],
)
def test_deepspeed_hostfile_and_include(inv, gpus, m, include):
    cmds = job(inv, "deepspeed", gpus, m).commands()
    assert list(cmds) == ["gpubox"]  # the runner starts on the one machine
    argv = shlex.split(cmds["gpubox"].split("&& ", 2)[2].split("; ", 1)[1])
    assert argv[argv.index("--include") + 1] == include
    assert "--ssh_port" not in argv  # the aliases carry Port 2222
    assert argv[argv.index("--master_addr") + 1] == "10.0.0.5"
    hostfile = "".join(f"emu-{k} slots={gpus}\n" for k in range(m))
    assert f"printf %s {shlex.quote(hostfile)} > hostfile" in cmds["gpubox"]


@pytest.mark.parametrize(
    "gpus,m,visible",
    [(2, 2, ["0", "1"]), (4, 2, ["0,1", "2,3"]), (8, 4, ["0,1", "2,3", "4,5", "6,7"])],
)
def test_torchrun_one_agent_per_emulated_node(inv, gpus, m, visible):
    j = job(inv, "torchrun", gpus, m)
    cmds = j.commands()
    assert list(cmds) == [f"emu-{k}" for k in range(m)]
    assert {j.session_of(label) for label in cmds} == {"gpubox"}
    for k, cmd in enumerate(cmds.values()):
        assert f"export CUDA_VISIBLE_DEVICES={visible[k]}; " in cmd
        assert f"--nnodes={m}" in cmd and f"--nproc-per-node={gpus // m}" in cmd
        assert "--rdzv-endpoint=10.0.0.5:29500" in cmd
    assert len({c.split("CUDA_VISIBLE_DEVICES=")[1].split(";")[0] for c in cmds.values()}) == m


def test_cpu_machine_one_process_per_emulated_node(inv):
    j = job(inv, "deepspeed", 0, 3)
    cmd = j.commands()["gpubox"]
    assert "--include" not in cmd and "emu-2 slots=1" in cmd
    cmds = job(inv, "torchrun", 0, 2).commands()
    assert all("CUDA_VISIBLE_DEVICES" not in c and "--nproc-per-node=1" in c for c in cmds.values())
    mpi = job(inv, "mpirun", 0, 2).commands()["gpubox"]
    assert "-H emu-0:1,emu-1:1" in mpi and "-np 2" in mpi


def test_network_path_option(inv):
    cmd = job(inv, "deepspeed", 2, 2, network=True).commands()["gpubox"]
    assert " NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1; " in cmd and "export " in cmd
    assert "NCCL_P2P_DISABLE" not in job(inv, "deepspeed", 2, 2).commands()["gpubox"]


def test_alias_block_pins_the_machines_own_host_key(inv):
    host = inv.select("gpubox")[0]
    block = E.alias_block(E.emulation_of(host, 2, 2, "deepspeed", False), host)
    assert block.splitlines() == [
        "Host emu-0 emu-1",
        "    HostName 10.0.0.5",
        "    Port 2222",
        "    HostKeyAlias [gpubox]:2222",
        "    IdentityFile ~/.ssh/nodeprep_cluster_ed25519",
        "    IdentitiesOnly yes",
    ]


def test_refused_combinations(inv):
    with pytest.raises(InputError, match="ONE machine look like 2 nodes, but 2 nodes"):
        E.check_emulate(2, inv.select(None), "deepspeed")
    with pytest.raises(InputError, match="srun"):
        E.check_emulate(2, inv.select("gpubox"), "srun")
    with pytest.raises(InputError, match="Open MPI gives every emulated node local ranks"):
        E.emulation_of(inv.select("gpubox")[0], 2, 4, "mpirun", False)
    with pytest.raises(InputError, match="do not split evenly"):
        E.emulation_of(inv.select("gpubox")[0], 3, 4, "deepspeed", False)
    with pytest.raises(InputError, match="cannot emulate 4 nodes on 2 GPU"):
        E.emulation_of(inv.select("gpubox")[0], 4, 2, "torchrun", False)
