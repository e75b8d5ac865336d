"""`train` on the container way (issue 45), on 2 lab nodes with rootless Podman (lab.up
--containers) and NO venv on the hosts: the lab's training image (lab/images.train_root: Debian 12
+ /opt/venv with CPU torch, DeepSpeed and numpy, built here from the controller's wheels) is
provisioned by the container role, then the user's own script (scripts/plain_ddp.py) and the
builtin DDP payload run inside it, 2 ranks a node, under torchrun, DeepSpeed (--no_ssh per node),
mpirun (the host's Open MPI) and srun (the lab's real Slurm), those two exec'ing each rank into
its node's container. Every end leaves no container of the job on any node.

Lab "ctrain" (10.184.0.0/16)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import ProvisionOptions, TrainOptions, VerifyOptions
from nodeprep.lab import images
from nodeprep.ops.container import archive
from nodeprep.ops.pystack.wheelhouse import Platform, Wheelhouse

from .conftest import ssh_argv

NAME, SUBNET, NODES = "ctrain", 184, 2  # 194-199: other modules; 189 down: workers
SCRIPT = Path(__file__).resolve().parent / "scripts" / "plain_ddp.py"


@pytest.fixture(scope="module")
def ctrain(tmp_path_factory, own_settings):
    base = tmp_path_factory.mktemp("ctrain")
    settings = own_settings(base, lock_wait=60)
    labmod.down(NAME, settings, log=lambda m: None)
    try:
        info = labmod.up(
            NODES,
            NAME,
            settings,
            labmod.UpOptions(
                inventory_dir=base / "inv", subnet=SUBNET, containers=True, slurm=True
            ),
            log=lambda m: None,
        )
        image = images.docker_archive(
            images.train_root(train_wheels()),
            base / "np-train.tar",
            "localhost/np-train:1",
            env=images.TRAIN_PATH,
        )
        inv = yaml.safe_load(info.inventory.read_text())
        inv["vars"].update({"container_image": str(image), "slots": 2})
        info.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))
        rc = api.provision(
            ProvisionOptions(inventory=str(info.inventory), roles="ssh_keys,ssh_config,container"),
            settings,
        )
        assert rc == 0
        yield info, settings, image
    finally:  # a setup that fails (the image, the provision) takes its lab down too
        labmod.down(NAME, settings, log=lambda m: None, purge=True)


def train_wheels() -> Path:
    """The training image's wheels for Debian 12's CPython (the wheelhouse role's code: the
    DeepSpeed sdist built once, the rest resolved from the package index), cached beside the
    lab's images."""
    house = Wheelhouse(images.CACHE / "wheelhouse")
    built = house.build(images.TRAIN_BUILDS, images.TRAIN_PINS[0], [])
    platform = Platform("x86_64", "3.11", "2.36")
    house.resolve(platform, list(images.TRAIN_PINS), [], [built])
    return house.root / platform.key


def _ssh(ctrain, index: int, command: str) -> subprocess.CompletedProcess:
    info, settings = ctrain[0], ctrain[1]
    argv = ssh_argv(info, info.nodes[index], settings, command)
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def _train(ctrain, capfd, launcher, payload=str(SCRIPT), args=(), **kw) -> tuple[int, str]:
    info, settings = ctrain[0], ctrain[1]
    code = api.train(
        TrainOptions(
            inventory=str(info.inventory),
            launcher=launcher,
            payload=payload,
            args=tuple(args),
            timeout=240,
            **kw,
        ),
        settings,
    )
    out = capfd.readouterr()
    return code, out.out + out.err


def _containers_left(ctrain) -> list[str]:
    return [_ssh(ctrain, i, "podman ps -a -q").stdout.strip() for i in range(NODES)]


def test_the_hosts_have_no_torch_only_the_image_does(ctrain):
    for i in range(NODES):
        assert _ssh(ctrain, i, "python3 -c 'import torch'").returncode != 0
    want = archive.read(ctrain[2]).id
    for i in range(NODES):
        assert want in _ssh(ctrain, i, "podman images --no-trunc -q").stdout


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed", "mpirun", "srun"])
def test_the_users_script_runs_unchanged_in_the_image_under_each_launcher(ctrain, capfd, launcher):
    code, out = _train(ctrain, capfd, launcher)
    assert code == 0, out
    for rank in range(4):
        assert f"plain: done rank {rank}/4" in out, out
    assert "finished on 2 node(s)" in out, out
    assert _containers_left(ctrain) == ["", ""]


def test_the_builtin_ddp_tutorial_trains_in_the_image(ctrain, capfd):
    code, out = _train(ctrain, capfd, "torchrun", payload="ddp", args=("--epochs", "2"))
    assert code == 0, out
    assert _containers_left(ctrain) == ["", ""]


@pytest.mark.parametrize("launcher", ["deepspeed", "srun"])
def test_a_failed_rank_stops_every_rank_in_every_container_and_leaves_none(ctrain, capfd, launcher):
    t0 = time.monotonic()
    code, out = _train(
        ctrain,
        capfd,
        launcher,
        args=("--steps", "400", "--sleep", "0.2", "--fail-at-step", "3", "--fail-rank", "3"),
    )
    assert code == 1, out
    assert "FAILED: worker-1 r3" in out, out
    assert "stopped by nodeprep" in out, out
    assert time.monotonic() - t0 < 60, out  # 400 steps of 0.2 s would be 80 s
    assert _containers_left(ctrain) == ["", ""]
    for i in range(NODES):  # no rank of the job left on the host either
        assert _ssh(ctrain, i, "pgrep -u $(id -u) -f rank.py").stdout == ""


def test_a_detached_run_stopped_from_another_shell_leaves_no_container(ctrain):
    info, settings = ctrain[0], ctrain[1]
    env = {
        "INVOKE_NODEPREP_STATE_DIR": str(settings.state_dir),
        "INVOKE_NODEPREP_LAB_ROOT": str(settings.lab_root),
        "PATH": "/usr/bin:/bin",
        "HOME": str(Path.home()),
    }
    invoke = [str(Path(sys.executable).parent / "invoke")]
    root = Path(__file__).resolve().parents[2]
    started = subprocess.run(
        invoke
        + ["train", "--inventory", str(info.inventory), "--launcher", "torchrun"]
        + ["--payload", str(SCRIPT), "--detach", "--", "--steps", "600", "--sleep", "0.2"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    job = re.search(r"run id (\S+)", started.stdout + started.stderr).group(1)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and "" in _containers_left(ctrain):
        time.sleep(1)
    assert "" not in _containers_left(ctrain)  # running: one container on each node
    stop = subprocess.run(
        invoke + ["train.stop", job], cwd=root, env=env, capture_output=True, text=True
    )
    assert stop.returncode == 0 and "the supervisor stopped the job" in stop.stdout, (
        stop.stdout + stop.stderr
    )
    assert _containers_left(ctrain) == ["", ""]


def test_dry_run_shows_each_nodes_engine_command(ctrain, capfd):
    code, out = _train(ctrain, capfd, "torchrun", dry_run=True)
    assert code == 0, out
    for node in ("worker-0", "worker-1"):
        start = next(ln for ln in out.splitlines() if ln.startswith(f"{node} (container):"))
        for flag in ("podman run -d", "--network host", "--ipc host", "--userns keep-id"):
            assert flag in start, start
        run = next(ln for ln in out.splitlines() if ln.startswith(f"{node}: podman exec"))
        assert "python3 -m torch.distributed.run" in run, run
    assert _containers_left(ctrain) == ["", ""]


def test_parity_reads_the_python_stack_inside_the_image(ctrain, capsys):
    """verify-parity on the container way: no venv asked of the hosts, the image's own python3,
    packages and torch compared (IMAGE_STACK), nothing drifts, nothing to fix."""
    info, settings = ctrain[0], ctrain[1]
    api.verify_parity(VerifyOptions(inventory=str(info.inventory), json=True, port=None), settings)
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["drift"] == [] and report["checks"] == [], report
    assert report["compared_keys"] >= 30, report  # the image's packages among them


def test_a_node_without_the_image_is_named_with_the_fix(ctrain, capfd):
    assert _ssh(ctrain, 1, "podman rmi -a -f >/dev/null 2>&1; true").returncode == 0
    code, out = _train(ctrain, capfd, "torchrun")
    assert code == 2 or code == 1, out
    line = next(ln for ln in out.splitlines() if "worker-1:" in ln and "image" in ln)
    assert "does not hold the image sha256:" in line and "--roles container" in line, out
