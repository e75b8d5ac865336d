"""A job's container on one node as argv (ops/container/run.py): the flags each engine gets for
the node it runs on. The lab test runs these very lines through real Podman."""

from __future__ import annotations

from nodeprep.ops.container import run, spec

ID = "sha256:" + "ab" * 32


def c(**kw) -> run.NodeContainer:
    base = dict(engine="podman", image=ID, job="j1", workdir="/home/u/.nodeprep/jobs/j1")
    return run.NodeContainer(**{**base, **kw})


def flags(argv: list[str]) -> list[tuple[str, str]]:
    return [(a, b) for a, b in zip(argv, argv[1:]) if a.startswith("-")]


def test_a_cpu_node_under_rootless_podman():
    argv = c(env=("MASTER_ADDR", "NCCL_DEBUG")).start()
    assert argv[:6] == ["podman", "run", "-d", "--rm", "--name", "nodeprep-j1"]
    f = flags(argv)
    for pair in [
        ("--network", "host"),
        ("--ipc", "host"),
        ("--userns", "keep-id"),
        ("--security-opt", "label=disable"),
        ("-v", "/home/u/.nodeprep/jobs/j1:/home/u/.nodeprep/jobs/j1"),
        ("-w", "/home/u/.nodeprep/jobs/j1"),
        ("-e", "MASTER_ADDR"),
        ("-e", "NCCL_DEBUG"),
        ("--label", "nodeprep.job=j1"),
    ]:
        assert pair in f, pair
    assert argv[-4:] == ["--entrypoint", "sleep", ID, "infinity"]
    assert not any(a.startswith("--device") or a == "--gpus" for a in argv)


def test_variables_go_by_name_never_with_their_value():
    argv = c(env=("WANDB_API_KEY",)).start()
    assert "WANDB_API_KEY" in argv and not any("=" in a and "WANDB" in a for a in argv)


def test_gpus_all_or_a_pick_per_engine():
    assert ("--device", "nvidia.com/gpu=all") in flags(c(gpu_count=8).start())
    picked = c(gpu_count=8, gpus=(2, 3)).start()
    assert [b for a, b in flags(picked) if a == "--device"] == [
        "nvidia.com/gpu=2",
        "nvidia.com/gpu=3",
    ]
    assert ("--gpus", "all") in flags(c(engine="docker", gpu_count=4).start())
    assert ("--gpus", '"device=0,1"') in flags(c(engine="docker", gpu_count=4, gpus=(0, 1)).start())
    assert "--gpus" not in c(engine="docker", gpu_count=4, gpus=()).start()


def test_rdma_nodes_get_the_devices_and_pinned_memory():
    f = flags(c(rdma=True).start())
    assert ("--device", "/dev/infiniband") in f and ("--ulimit", "memlock=-1:-1") in f
    assert ("--cap-add", "IPC_LOCK") in f


def test_docker_and_sudo_and_rootful_podman():
    d = c(engine="docker").start()
    assert "--userns" not in d and "label=disable" not in d
    s = c(sudo=True, rootless=False).start()
    assert s[:3] == ["sudo", "-n", "podman"] and "--userns" not in s


def test_mounts_exec_remove_and_leftovers():
    m = c(mounts=(spec.Mount("/data", "/data", True), spec.Mount("/scratch", "/s"))).start()
    assert ("-v", "/data:/data:ro") in flags(m) and ("-v", "/scratch:/s") in flags(m)
    assert c().exec(["python3", "train.py"], ("RANK",)) == [
        "podman",
        "exec",
        "-i",
        "-w",
        "/home/u/.nodeprep/jobs/j1",
        "-e",
        "RANK",
        "nodeprep-j1",
        "python3",
        "train.py",
    ]
    assert c().remove() == ["podman", "rm", "-f", "-t", "0", "--ignore", "nodeprep-j1"]
    assert c(engine="docker").remove() == ["docker", "rm", "-f", "nodeprep-j1"]
    assert c().leftovers()[-2:] == ["--filter", "label=nodeprep.job=j1"]
