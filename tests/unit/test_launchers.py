import fcntl
import os
import shlex
import socket
import subprocess
from pathlib import Path

import pytest

from nodeprep.errors import InputError
from nodeprep.inventory.model import Host
from nodeprep.nodeside import BUILTIN
from nodeprep.nodeside import path as payload_path
from nodeprep.ops.train import gpusplit
from nodeprep.ops.train import launchers as L

PY = "/home/lab/env/bin/python"


def two(slots=1, ports=(22, 22)):
    return [
        L.NodeSlots("worker-0", "10.200.0.10", slots, ports[0]),
        L.NodeSlots("worker-1", "10.200.0.11", slots, ports[1]),
    ]


# ---------------------------------------------------------------- hostfile / nodes


def test_hostfile():
    assert L.hostfile(two(4)) == "worker-0 slots=4\nworker-1 slots=4\n"


@pytest.mark.parametrize(
    "nodes, message",
    [
        ([], "no nodes"),
        ([L.NodeSlots("a b", "x", 1)], "cannot go in a hostfile"),
        ([L.NodeSlots("a", "x", 1), L.NodeSlots("a", "y", 1)], "listed twice"),
        ([L.NodeSlots("a", "x", 0)], "slots=0"),
    ],
)
def test_hostfile_rejects(nodes, message):
    with pytest.raises(InputError, match=message):
        L.hostfile(nodes)


def test_from_hosts():
    hosts = [
        Host("g1", "10.0.0.5", 2222, user="lab", key=None, groups=(), vars={}, origin={}, slots=8),
        Host("g2", "10.0.0.6", 22, user=None, key=None, groups=(), vars={}, origin={}, slots=None),
    ]
    assert L.from_hosts(hosts, slots=2) == [
        L.NodeSlots("g1", "10.0.0.5", 8, 2222),
        L.NodeSlots("g2", "10.0.0.6", 2, 22),
    ]


# ---------------------------------------------------------------- deepspeed


def test_deepspeed_cmd():
    argv = L.deepspeed_cmd(
        L.Program(PY, "train.py", ["--lr", "0.1"]), two(), ("10.200.0.10", 29500)
    )
    assert argv == [
        "/home/lab/env/bin/deepspeed",
        "-H",
        "{hostfile}",
        "--launcher",
        "pdsh",
        "--master_addr",
        "10.200.0.10",
        "--master_port",
        "29500",
        "train.py",
        "--lr",
        "0.1",
    ]
    assert L.fill_hostfile(argv, "/job/hf")[2] == "/job/hf"


def test_deepspeed_ssh_port():
    # shared non-22 port -> --ssh_port; explicit 22 overrides; mixed ports -> clear error
    argv = L.deepspeed_cmd(L.Program(PY, "t.py"), two(ports=(2222, 2222)), ("a", 29500))
    assert argv[argv.index("--ssh_port") + 1] == "2222"
    argv = L.deepspeed_cmd(L.Program(PY, "t.py"), two(), ("a", 29500), ssh_port=2200)
    assert argv[argv.index("--ssh_port") + 1] == "2200"
    assert "--ssh_port" not in L.deepspeed_cmd(
        L.Program(PY, "t.py"), two(ports=(2222, 2223)), ("a", 29500), ssh_port=22
    )
    with pytest.raises(InputError, match="ports 2222, 2223"):
        L.deepspeed_cmd(L.Program(PY, "t.py"), two(ports=(2222, 2223)), ("a", 29500))


def test_deepspeed_include_and_launcher():
    argv = L.deepspeed_cmd(
        L.Program(PY, "t.py"), two(2), ("a", 1), launcher="openmpi", include="worker-0:0@worker-1:1"
    )
    assert argv[argv.index("--include") + 1] == "worker-0:0@worker-1:1"
    assert argv[argv.index("--launcher") + 1] == "openmpi"
    with pytest.raises(InputError, match="slot '2' on 'worker-1'"):
        L.deepspeed_cmd(L.Program(PY, "t.py"), two(2), ("a", 1), include="worker-1:2")
    with pytest.raises(InputError, match="'worker-9'"):
        L.deepspeed_cmd(L.Program(PY, "t.py"), two(2), ("a", 1), include="worker-9:0")
    with pytest.raises(InputError, match="unknown DeepSpeed launcher"):
        L.deepspeed_cmd(L.Program(PY, "t.py"), two(), ("a", 1), launcher="ssh")
    with pytest.raises(InputError, match="master address"):
        L.deepspeed_cmd(L.Program(PY, "t.py"), two(), ("", 1))


def test_quoting_of_odd_args():
    odd = ["--name", "my run", "--note", 'it\'s "quoted"', "$HOME;rm -rf /"]
    prog = L.Program(PY, "my script.py", odd)
    for argv in (
        L.deepspeed_cmd(prog, two(), ("a", 1)),
        L.torchrun_cmd(prog, 2, 1, ("h:1", "j")),
        L.mpirun_cmd(prog, two(), ("a", 1), []),
        L.srun_cmd(prog, two(), 1, {"A": "x y"}),
    ):
        assert argv[-len(odd) :] == odd  # argv keeps each value as one token
        assert shlex.split(L.shell(argv)) == argv  # and the shell form round-trips
    assert "'my run'" in L.shell(argv) and "'$HOME;rm -rf /'" in L.shell(argv)


# ---------------------------------------------------------------- torchrun


def test_torchrun_cmd():
    argv = L.torchrun_cmd(
        L.Program(PY, "t.py", ["--epochs", "2"]), 2, 8, ("10.200.0.10:29500", "job1")
    )
    assert argv == [
        PY,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.200.0.10:29500",
        "--rdzv-id=job1",
        "t.py",
        "--epochs",
        "2",
    ]
    argv = L.torchrun_cmd(
        L.Program(PY, "t.py"), 2, 1, ("[::1]:29500", "j"), max_restarts=3, node_rank=1
    )
    assert "--max-restarts=3" in argv and "--node-rank=1" in argv
    assert argv.index("--node-rank=1") < argv.index("t.py")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"rdzv_endpoint": "10.0.0.1"}, "not HOST:PORT"),
        ({"rdzv_endpoint": "h:99999"}, "not HOST:PORT"),
        ({"nnodes": 0}, "nnodes=0"),
        ({"nproc_per_node": "2"}, "nproc_per_node='2'"),
        ({"rdzv_id": "a b"}, "has spaces"),
    ],
)
def test_torchrun_rejects(kwargs, message):
    base = dict(
        python=PY,
        script="t.py",
        args=[],
        nnodes=2,
        nproc_per_node=1,
        rdzv_endpoint="h:29500",
        rdzv_id="j",
    )
    k = {**base, **kwargs}
    with pytest.raises(InputError, match=message):
        L.torchrun_cmd(
            L.Program(k["python"], k["script"], k["args"]),
            k["nnodes"],
            k["nproc_per_node"],
            (k["rdzv_endpoint"], k["rdzv_id"]),
        )


# ---------------------------------------------------------------- mpirun


def test_mpirun_cmd():
    argv = L.mpirun_cmd(
        L.Program(PY, "t.py", ["-x"]),
        two(2),
        ("10.200.0.10", 29500),
        ["NCCL_DEBUG", "PATH", "FI_PROVIDER"],
        iface="=eth0",
    )
    assert argv == [
        "mpirun",
        "-np",
        "4",
        "-H",
        "worker-0:2,worker-1:2",
        "-x",
        "MASTER_ADDR=10.200.0.10",
        "-x",
        "MASTER_PORT=29500",
        "-x",
        "PATH",
        "-x",
        "LD_LIBRARY_PATH",
        "-x",
        "NCCL_DEBUG",
        "-x",
        "FI_PROVIDER",
        "-bind-to",
        "none",
        "-map-by",
        "slot",
        "-mca",
        "pml",
        "ob1",
        "-mca",
        "btl",
        "^openib",
        "-mca",
        "btl_tcp_if_include",
        "eth0",
        "-mca",
        "oob_tcp_if_include",
        "eth0",
        PY,
        "-u",
        "t.py",
        "-x",
    ]


def test_mpirun_port_iface_and_names():
    argv = L.mpirun_cmd(
        L.Program(PY, "t.py"), two(ports=(2222, 2222)), ("a", 1), [], iface="^docker0"
    )
    assert shlex.join(argv).count("plm_rsh_args '-p 2222'") == 1
    assert argv[argv.index("btl_tcp_if_exclude") + 1] == "docker0,lo"
    with pytest.raises(InputError, match="ports 22, 2222"):
        L.mpirun_cmd(L.Program(PY, "t.py"), two(ports=(22, 2222)), ("a", 1), [])
    with pytest.raises(InputError, match="not an environment variable name"):
        L.mpirun_cmd(L.Program(PY, "t.py"), two(), ("a", 1), ["WANDB_API_KEY=secret"])


# ---------------------------------------------------------------- srun


def test_srun_labelled_lines_go_to_their_node():
    names = ["gpu01", "gpu02", "gpu03"]
    assert L.srun_line_node("0: rank 0", names, 4) == "gpu01"
    assert L.srun_line_node("  7: rank 7", names, 4) == "gpu02"  # srun pads the label
    assert L.srun_line_node("11: x", names, 4) == "gpu03"
    assert L.srun_line_node("12: x", names, 4) is None  # more tasks than nodes
    assert L.srun_line_node("srun: error: gpu02: task 5: Exited with exit code 1", names, 4) is None


def test_srun_cmd():
    nodes = [L.NodeSlots(f"gpu0{i}", f"10.0.0.{i}", 4) for i in range(1, 4)]
    argv = L.srun_cmd(
        L.Program(PY, "t.py", ["--epochs", "1"]),
        nodes,
        4,
        {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": 29500},
    )
    assert argv == [
        "srun",
        "--nodes",
        "3",
        "--nodelist",
        "gpu[01-03]",
        "--ntasks-per-node",
        "4",
        "--kill-on-bad-exit=1",
        "--label",
        "--export=ALL,MASTER_ADDR=10.0.0.1,MASTER_PORT=29500",
        PY,
        "-u",
        "t.py",
        "--epochs",
        "1",
    ]
    with pytest.raises(InputError, match="cannot pass through srun --export"):
        L.srun_cmd(L.Program(PY, "t.py"), nodes, 4, {"NCCL_SOCKET_IFNAME": "^docker0,lo"})
    with pytest.raises(InputError, match="gpus_per_node=0"):
        L.srun_cmd(L.Program(PY, "t.py"), nodes, 0, {})


# ---------------------------------------------------------------- emulate (ops/train/gpusplit.py)


@pytest.mark.parametrize(
    "gpus, nodes, include, devices, visible",
    [
        (2, 2, "worker-0:0@worker-1:1", [[0], [1]], ["0", "1"]),
        (4, 2, "worker-0:0,1@worker-1:2,3", [[0, 1], [2, 3]], ["0,1", "2,3"]),
        (
            8,
            4,
            "worker-0:0,1@worker-1:2,3@worker-2:4,5@worker-3:6,7",
            [[0, 1], [2, 3], [4, 5], [6, 7]],
            ["0,1", "2,3", "4,5", "6,7"],
        ),
    ],
)
def test_emulate(gpus, nodes, include, devices, visible):
    e = gpusplit.emulated(gpus, nodes)
    assert e["include"] == include
    assert e["devices"] == devices
    assert e["cuda_visible"] == visible
    assert e["slots"] == [gpus // nodes] * nodes
    assert e["names"] == [f"worker-{k}" for k in range(nodes)]
    # every emulated node lists all K GPUs: DeepSpeed requires include slots < hostfile slots
    assert e["hostfile"] == "".join(f"worker-{k} slots={gpus}\n" for k in range(nodes))
    # and the pair is accepted by the builder's own --include check
    hf_nodes = [L.NodeSlots(n, "127.0.0.1", gpus) for n in e["names"]]
    assert L.deepspeed_cmd(L.Program(PY, "t.py"), hf_nodes, ("127.0.0.1", 1), include=e["include"])


def test_emulate_prefix_and_errors():
    assert gpusplit.emulated(2, 1, prefix="n")["include"] == "n0:0,1"
    with pytest.raises(InputError, match="3 GPUs do not split evenly over 2 nodes"):
        gpusplit.emulated(3, 2)
    with pytest.raises(InputError, match="cannot emulate 4 nodes on 2 GPU"):
        gpusplit.emulated(2, 4)
    with pytest.raises(InputError, match="cannot emulate"):
        gpusplit.emulated(0, 1)


def test_builtin_payloads():
    assert set(BUILTIN) == {"health", "ddp", "allreduce"}
    for name in BUILTIN:
        text = payload_path(name).read_text()
        assert "nodeprep" not in [
            line.split()[1] for line in text.splitlines() if line.startswith(("import ", "from "))
        ]
        # in ruff-formatted lines: one argument a line took ddp.py from 195 to 227 lines of the
        # same code, and its main() under 60 lines to 241
        assert len(text.splitlines()) < 250


# ================================================================ REAL payload runs
# These start real processes: torch CPU + gloo, 2 ranks on this machine through torchrun
# (the argv comes from torchrun_cmd). They need a venv with torch; /tmp/tv is reused, or
# created here once (~25 s). Nothing is skipped.

TV = Path("/tmp/tv")


@pytest.fixture(scope="session")
def torch_python():
    python = TV / "bin" / "python"
    # one maker at a time (the suite's workers): the others wait, then find it usable
    with open(f"{TV}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _make_torch_venv(python)
    return str(python)


def _make_torch_venv(python: Path) -> None:
    usable = (
        python.exists()
        and subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode == 0
    )
    if not usable:
        subprocess.run(["python3", "-m", "venv", str(TV)], check=True)
        # pinned: an unpinned torch pulls GBs of CUDA wheels
        subprocess.run(
            [str(TV / "bin" / "pip"), "install", "-q", "torch==2.13.0+cpu", "numpy==2.4.6"],
            check=True,
            timeout=600,
        )


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(python, name, args, cwd, restarts=0, env=None):
    argv = L.torchrun_cmd(
        L.Program(python, str(payload_path(name)), args),
        1,
        2,
        (f"127.0.0.1:{free_port()}", f"test-{name}"),
        max_restarts=restarts,
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NODEPREP_PG_TIMEOUT": "30", **(env or {})}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def lines(proc):
    return proc.stdout.splitlines()


def test_real_health_torchrun(torch_python, tmp_path):
    proc = launch(torch_python, "health", [], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = sorted(line for line in lines(proc) if line.startswith("rank "))
    assert len(ranks) == 2
    assert ranks[0].startswith("rank 0/2 host=") and ranks[1].startswith("rank 1/2 host=")
    assert "backend=gloo" in ranks[0] and "nccl=- device=cpu" in ranks[0]
    assert lines(proc)[-1] == "health: OK world_size=2"


@pytest.mark.parametrize(
    "launcher_env",
    [
        {
            "OMPI_COMM_WORLD_RANK": "0",
            "OMPI_COMM_WORLD_SIZE": "1",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        },
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"},
    ],
)
def test_real_health_mpi_and_slurm_env(torch_python, tmp_path, launcher_env):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(launcher_env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    proc = subprocess.run(
        [torch_python, str(payload_path("health"))],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert lines(proc)[0].startswith("rank 0/1 ") and lines(proc)[-1] == "health: OK world_size=1"


def test_real_health_missing_peer_fails_clearly(torch_python, tmp_path):
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "NODEPREP_PG_TIMEOUT": "2",
    }
    proc = subprocess.run(
        [torch_python, str(payload_path("health"))],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stdout.startswith("health: FAIL rank 0: init_process_group(gloo) via 127.0.0.1:")


def test_real_ddp_snapshot_resume_and_failure(torch_python, tmp_path):
    args = ["--epochs", "2", "--steps-per-epoch", "3"]
    first = launch(torch_python, "ddp", args, tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "rank 1 epoch 1 step 6 loss " in first.stdout
    assert lines(first)[-1].startswith("ddp: done epochs=2 final_loss=")
    assert (tmp_path / "snapshot.pt").exists()
    assert not list(tmp_path.glob("*.tmp.*"))  # atomic write left no temp file

    second = launch(torch_python, "ddp", ["--epochs", "3", "--steps-per-epoch", "3"], tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "rank 0 resumed from epoch 2 step 6" in second.stdout
    assert "rank 1 resumed from epoch 2 step 6" in second.stdout
    assert "epoch 0 " not in second.stdout  # did not redo finished epochs
    assert lines(second)[-1].startswith("ddp: done epochs=3 final_loss=")

    failing = launch(
        torch_python,
        "ddp",
        ["--epochs", "5", "--steps-per-epoch", "3", "--fail-at-step", "11", "--fail-rank", "1"],
        tmp_path,
    )
    assert failing.returncode != 0
    assert "rank 1 failing on purpose at step 11" in failing.stdout
    assert "ddp: done" not in failing.stdout


def test_real_ddp_torchrun_restart_resumes(torch_python, tmp_path):
    # fails once at step 5 (epoch 1); torchrun restarts the workers, which resume from the
    # epoch-1 snapshot and finish (--fail-at-step only fires on the first attempt)
    proc = launch(
        torch_python,
        "ddp",
        ["--epochs", "3", "--steps-per-epoch", "3", "--fail-at-step", "5", "--fail-rank", "1"],
        tmp_path,
        restarts=1,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 1 failing on purpose at step 5" in proc.stdout
    assert "rank 0 resumed from epoch 1 step 3" in proc.stdout
    assert lines(proc)[-1].startswith("ddp: done epochs=3 final_loss=")
