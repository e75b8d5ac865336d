"""train on the container way, as data: what each launcher runs inside the job's containers, the
container each node gets from its facts (the CONTAINER facts recorded on the lab's Podman and
refusing Docker CLIs, tests/facts/container/), and what blocks the launch."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from nodeprep.commands.options import TrainOptions
from nodeprep.commands.train.launch import containers_of, shown
from nodeprep.commands.train.prepare import plan_of
from nodeprep.engine.facts import CONTAINER, FactValues
from nodeprep.inventory import load
from nodeprep.ops.container import spec as specmod
from nodeprep.ops.train import incontainer

CASES = Path(__file__).parents[1] / "facts" / "container"
HELD = "sha256:ce7323bb61c70fd4bfb9860ba00458616d99b7de8aa9ee848318023cd7fd34ca"  # np-tiny:1
ENGINES = "podman,docker"


def recorded(name: str) -> dict:
    return json.loads((CASES / f"{name}.json").read_text())["expected"]


class Archive:  # the ArchiveImage fields job_containers reads
    def __init__(self, ident):
        self.id = ident


@pytest.fixture
def inv(tmp_path):
    p = tmp_path / "hosts.yml"
    p.write_text(
        "vars:\n  user: ops\n  slots: 2\n  container_image: /srv/train.tar\n"
        "  container_env: {HF_HOME: /scratch/hf, NOTE: \"it's 'quoted' $x\"}\n"
        "hosts:\n  n0: {address: 10.0.0.10}\n  n1: {address: 10.0.0.11}\n"
    )
    return load(str(p))


def facts(case="podman_with_images", uid=1000, rdma=()):
    return FactValues(
        {
            "gpus": {"count": 0},
            "identity": {"machine": f"m{uid}", "home": "h"},
            "user": {"name": "ops", "uid": uid, "home": "/home/ops"},
            CONTAINER(ENGINES).key: recorded(case),
            "rdma_ports": list(rdma),
        }
    )


def plan(inv, launcher, cases=("podman_with_images", "podman_with_images"), image=HELD, args=()):
    hosts = inv.select(None)
    got = {h.name: facts(c, uid=1000 + i) for i, (h, c) in enumerate(zip(hosts, cases))}
    vars_of = {h.name: {n: inv.var(h, n) for n in inv.schema} for h in hosts}
    p, _ = plan_of(
        TrainOptions(inventory=None, launcher=launcher, payload="health", args=args),
        "job1",
        hosts,
        got,
        vars_of,
    )
    specs = {h.name: specmod.from_vars(vars_of[h.name]) for h in hosts}
    jc, problems = incontainer.job_containers(
        p.nodes, "job1", got, specs, {h.name: Archive(image) for h in hosts}
    )
    return p.in_containers(jc), problems


def test_torchrun_runs_inside_each_nodes_container_with_the_images_python(inv):
    p, problems = plan(inv, "torchrun")
    assert problems == []
    cmds = p.commands()
    assert set(cmds) == {"n0", "n1"}
    argv = shlex.split(cmds["n1"])
    assert argv[:4] == ["podman", "exec", "-i", "-w"]
    assert argv[argv.index("sh") - 1] == "nodeprep-job1"
    inner = argv[-1]
    assert "python3 -m torch.distributed.run --nnodes=2 --nproc-per-node=2" in inner
    assert "/home/ops/.nodeprep/agent/rank.py health.py" in inner
    # the launcher gets the job, its home and its node from outside; the rest it sets itself
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-e"] == list(incontainer.LAUNCH_ENV)


def test_deepspeed_starts_each_nodes_part_itself_without_ssh(inv):
    p, _ = plan(inv, "deepspeed", args=("--launcher", "pdsh"))
    cmds = p.commands()
    assert set(cmds) == {"n0", "n1"}  # no pdsh from the head: one command per node
    for rank, node in enumerate(("n0", "n1")):
        inner = shlex.split(cmds[node])[-1]
        run = inner[inner.index("python3 -m deepspeed.launcher.runner") :]
        words = shlex.split(run)
        assert words[3:5] == ["--no_ssh", f"--node_rank={rank}"]
        assert "--launcher" not in words[: words.index("health.py")]
        assert words[-2:] == ["--launcher", "pdsh"]  # the payload's own arguments, kept
        assert "n0 slots=2\nn1 slots=2" in inner  # the same hostfile on every node


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_mpirun_and_srun_exec_each_rank_into_its_nodes_container(inv, launcher):
    p, _ = plan(inv, launcher)
    cmds = p.commands()
    assert list(cmds) == ["n0"]  # the launcher runs on the head's host
    argv = shlex.split(cmds["n0"].split("&& ", 1)[1].split("; ")[-1])
    at = argv.index("exec")
    assert argv[at - 1] == "podman" and argv[argv.index("nodeprep-job1") + 1] == "python3"
    names = [argv[i + 1] for i, a in enumerate(argv) if a == "-e"]
    rank_vars = {"OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PYTHON_NODEPREP_JOB", "MASTER_ADDR"}
    assert rank_vars <= set(names)
    assert argv[0] == launcher


def test_the_container_start_keeps_values_off_the_command_line_and_host_paths_out(inv):
    p, _ = plan(inv, "torchrun")
    start = containers_of(p)["n0"]["start"]
    assert "umask 077" in start
    assert "grep -Ev '^(PATH|LD_LIBRARY_PATH|PYTHONPATH|PYTHONHOME|VIRTUAL_ENV)='" in start
    # container_env's values reach the env file literally, quoted for sh
    env_text = "HF_HOME=/scratch/hf\nNOTE=it's 'quoted' $x\n"
    assert shlex.quote(env_text) in start
    run = start.split(" && { ")[-1].split(" >/dev/null;")[0]
    assert start.endswith(
        "np_rc=$?; rm -f /home/ops/.nodeprep/runs/job1/container.env; exit $np_rc; }"
    )
    words = shlex.split(run)
    assert words[:3] == ["podman", "run", "-d"]
    assert "--env-file" in words and "-e" not in words
    for flag in ("--network", "--ipc"):
        assert words[words.index(flag) + 1] == "host"
    assert words[words.index("-v") + 1] == "/home/ops/.nodeprep:/home/ops/.nodeprep"
    assert words[-4:] == ["--entrypoint", "sleep", HELD, "infinity"]
    assert list(shown(p))[:2] == ["n0 (container)", "n1 (container)"]


def test_rdma_ports_bring_the_devices_and_unlimited_memlock(inv):
    hosts = inv.select(None)
    got = {
        h.name: facts(uid=1000 + i, rdma=[{"device": "mlx5_0", "port": 1}])
        for i, h in enumerate(hosts)
    }
    vars_of = {h.name: {n: inv.var(h, n) for n in inv.schema} for h in hosts}
    p, _ = plan_of(TrainOptions(launcher="torchrun"), "job1", hosts, got, vars_of)
    specs = {h.name: specmod.from_vars(vars_of[h.name]) for h in hosts}
    jc, problems = incontainer.job_containers(
        p.nodes, "job1", got, specs, {h.name: Archive(HELD) for h in hosts}
    )
    assert problems == []
    start = jc.of("n0").start()
    assert start[start.index("--device") + 1] == "/dev/infiniband"
    assert start[start.index("--ulimit") + 1] == "memlock=-1:-1"


@pytest.mark.parametrize(
    "case,words",
    [
        ("no_engine", "no container engine (podman or docker) on the PATH"),
        ("docker_denied", "usermod -aG docker"),
        ("docker_no_daemon", "systemctl enable --now docker"),
    ],
)
def test_a_node_that_cannot_run_the_image_is_one_line_with_the_fix(inv, case, words):
    _, problems = plan(inv, "torchrun", cases=("podman_with_images", case))
    assert len(problems) == 1 and problems[0].startswith("n1: ") and words in problems[0]


def test_a_node_without_the_image_is_told_to_provision_it(inv):
    missing = "sha256:" + "0" * 64
    _, problems = plan(inv, "torchrun", image=missing)
    assert problems == [
        f"{n}: podman does not hold the image {missing}: run `invoke provision --roles container`"
        for n in ("n0", "n1")
    ]


def test_a_registry_image_is_found_by_its_name_or_digest():
    spec = specmod.from_vars({"container_image": "localhost/np-tiny:1"})
    held = recorded("podman_with_images")["engines"]["podman"]
    assert incontainer.image_id(spec, None, held) == HELD
    spec = specmod.from_vars({"container_image": "localhost/np-tiny@sha256:" + "7" * 64})
    assert incontainer.image_id(spec, None, held) is None


def test_a_secret_in_container_env_is_refused_it_belongs_in_deepspeed_env():
    with pytest.raises(specmod.Refused) as e:
        specmod.from_vars({"container_image": "a/b:1", "container_env": {"HF_TOKEN": "x"}})
    assert e.value.var == "container_env" and "deepspeed_env" in str(e.value)


def test_an_engine_only_sudo_may_run_is_refused_for_train(inv, monkeypatch):
    """sudo's env_reset drops every `-e NAME` exec passes: the ranks would lose their rank."""
    real = recorded

    def sudo_only(name):
        out = real(name)
        out["engines"]["podman"]["access"] = "sudo"
        return out

    monkeypatch.setattr(sys.modules[__name__], "recorded", sudo_only)
    _, problems = plan(inv, "torchrun")
    assert problems and all("runs only through sudo here" in p for p in problems), problems


def test_two_nodes_on_one_machine_are_refused_one_container_name_each_job(tmp_path):
    p = tmp_path / "hosts.yml"
    p.write_text(
        "vars:\n  user: ops\n  container_image: /srv/train.tar\n"
        "hosts:\n  a: {address: 127.0.0.1}\n  b: {address: localhost}\n"
    )
    inv = load(str(p))
    hosts = inv.select(None)
    got = {h.name: facts(uid=1000) for h in hosts}  # one machine id: one machine
    vars_of = {h.name: {n: inv.var(h, n) for n in inv.schema} for h in hosts}
    pl, _ = plan_of(TrainOptions(launcher="torchrun"), "job1", hosts, got, vars_of)
    specs = {h.name: specmod.from_vars(vars_of[h.name]) for h in hosts}
    _, problems = incontainer.job_containers(
        pl.nodes, "job1", got, specs, {h.name: Archive(HELD) for h in hosts}
    )
    assert [q.split(":")[0] for q in problems] == ["a", "b"], problems
    assert all("shares its machine" in q for q in problems)
