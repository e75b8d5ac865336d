"""`invoke init` on the provisioned lab: from an Ansible INI inventory (groups kept), from an ssh
config (`sshconfig:FILE`), from a DeepSpeed hostfile plus --set for what a hostfile does not say,
and from `slurm:` inside a real allocation of the lab's Slurm, each node contacted once; the file
written is then used unchanged by provision (nothing to change: the lab is provisioned),
verify-parity and train. An existing inventory is refused without --force. The inventories go to a
scratch project directory (roles linked to the repo's), not the repo's inventory/."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep.commands.options import InitOptions, ProvisionOptions, TrainOptions, VerifyOptions

ROOT_ROLES = Path(__file__).resolve().parents[2] / "roles"


@pytest.fixture(scope="module")
def project(tmp_path_factory, lab_settings):
    p = tmp_path_factory.mktemp("initproj")
    (p / "roles").symlink_to(ROOT_ROLES)
    (p / "inventory").mkdir()
    return p, dataclasses.replace(lab_settings, project_root=str(p))


def sources(lab, base) -> dict[str, tuple[str, tuple[str, ...]]]:
    nodes = lab.nodes[:2]
    ini = base / "ansible.ini"
    ini.write_text(
        "[gpus]\n"
        + "".join(f"{n.name} ansible_host={n.address}\n" for n in nodes)
        + f"[all:vars]\nansible_user=nodeprep\nansible_ssh_private_key_file={lab.key}\n"
    )
    cfg = base / "ssh_config"
    cfg.write_text(
        "".join(
            f"Host {n.name}\n    HostName {n.address}\n    User nodeprep\n"
            f"    IdentityFile {lab.key}\n"
            for n in nodes
        )
    )
    hf = base / "hostfile"
    hf.write_text("".join(f"{n.address} slots=1\n" for n in nodes))
    # the lab reaches no PyTorch index: torch comes from pip's own configuration (as the lab's
    # inventory says), a value the source lacks, given with --set and written into the file
    local = ("torch_index=pip-config",)
    return {
        "ansible": (str(ini), local),
        "sshconfig": (f"sshconfig:{cfg}", local),
        "hostfile": (f"hostfile:{hf}", ("user=nodeprep", f"key={lab.key}", *local)),
    }


@pytest.mark.parametrize("form", ["ansible", "sshconfig", "hostfile"])
def test_init_then_provision_verify_and_train_use_it_unchanged(
    provisioned, lab, lab_settings, project, capfd, form
):
    base, init_settings = project
    source, sets = sources(lab, base)[form]
    name = f"from{form}"
    assert api.init(InitOptions(name=name, source=source, sets=sets), init_settings) == 0
    out = capfd.readouterr().out
    path = base / "inventory" / name / "hosts.yml"
    assert f"wrote {path}" in out and f"invoke provision --inventory {name}" in out, out
    text = path.read_text()
    assert "2 of 2 node(s) answered" in text and "torch-plan: x86_64 torch==" in text, text
    assert "torch_index: pip-config" in text, text  # what --set said, written
    if form == "ansible":
        assert "groups:\n  gpus: {hosts: [worker-0, worker-1]}" in text, text
    # a second init of the same name is refused, --force replaces it
    assert api.init(InitOptions(name=name, source=source, sets=sets), init_settings) == 2
    assert "exists" in capfd.readouterr().err
    inv = str(path)
    assert api.provision(ProvisionOptions(inventory=inv, sets=provisioned), lab_settings) == 0
    assert api.verify_parity(VerifyOptions(inventory=inv), lab_settings) == 0
    code = api.train(
        TrainOptions(
            inventory=inv, limit=None, launcher="deepspeed", payload="health", timeout=180
        ),
        lab_settings,
    )
    text = "".join(capfd.readouterr())
    assert code == 0 and "health: OK world_size=2" in text, text[-3000:]


# What a user inside an allocation runs: names resolve through the login node's /etc/hosts (a
# bind mount over it, in a mount namespace of the run's own), SLURM_JOB_NODELIST from salloc.
_INSIDE = r"""
import json, sys
from nodeprep import cli as api
from nodeprep.commands.options import InitOptions, ProvisionOptions, TrainOptions, VerifyOptions
from nodeprep.settings import Settings
a = json.loads(sys.argv[1])
s, p = Settings(**a["settings"]), Settings(**a["settings"], project_root=a["project"])
inv = a["project"] + "/inventory/fromslurm/hosts.yml"
codes = {"init": api.init(InitOptions(name="fromslurm", source="slurm:", sets=tuple(a["init_sets"])), p),
         "provision": api.provision(ProvisionOptions(inventory=inv, sets=tuple(a["sets"])), s),
         "verify": api.verify_parity(VerifyOptions(inventory=inv), s),
         "train": api.train(TrainOptions(inventory=inv, launcher="deepspeed", payload="health", timeout=180), s)}
print("CODES " + json.dumps(codes))
"""  # noqa: E501 (a program text, kept as written)


def test_init_from_slurm_inside_an_allocation(
    real_slurm, provisioned, lab, lab_settings, project, tmp_path
):
    base, _init_settings = project
    conf = Path(tempfile.mkdtemp()) / "slurm.conf"  # a copy the lab user can read (pytest's and the
    conf.write_text(
        (Path(lab_settings.lab_root) / lab.name / "slurm" / "slurm.conf").read_text()
    )  # lab's are root's)
    os.chmod(conf.parent, 0o755)
    os.chmod(conf, 0o644)
    env = dict(os.environ, SLURM_CONF=str(conf))
    r = subprocess.run(
        [
            "runuser",
            "-u",
            lab.user,
            "--",
            "salloc",
            "--no-shell",
            "-N",
            "2",
            "--nodelist=worker-[0-1]",
            "--immediate=20",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    job = re.search(r"Granted job allocation (\d+)", r.stdout + r.stderr)
    assert job, r.stderr
    hosts = tmp_path / "hosts"
    hosts.write_text(
        "127.0.0.1\tlocalhost\n" + "".join(f"{n.address}\t{n.name}\n" for n in lab.nodes)
    )
    args = {
        "settings": {
            "state_dir": lab_settings.state_dir,
            "lab_root": lab_settings.lab_root,
            "lock_wait": 120,
        },
        "project": str(base),
        "sets": list(provisioned),
        "init_sets": [
            f"user={lab.user}",
            f"key={lab.key}",
            "torch_index=pip-config",
            # the other forms' inventories already name these nodes worker-N (by address)
            # in the controller's ssh config: provision would refuse the alias clash
            "ssh_alias_prefix=slurm-",
        ],
    }
    try:
        r = subprocess.run(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                'mount --bind "$0" /etc/hosts && exec "$@"',
                str(hosts),
                sys.executable,
                "-c",
                _INSIDE,
                json.dumps(args),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=str(ROOT_ROLES.parent),
            env=dict(env, SLURM_JOB_ID=job.group(1), SLURM_JOB_NODELIST="worker-[0-1]"),
        )
    finally:
        subprocess.run(["scancel", job.group(1)], env=env, capture_output=True)
        shutil.rmtree(conf.parent)
    codes = re.search(r"CODES (.*)", r.stdout)
    assert codes and json.loads(codes.group(1)) == {
        "init": 0,
        "provision": 0,
        "verify": 0,
        "train": 0,
    }, (r.stdout[-4000:], r.stderr[-4000:])
    text = (base / "inventory" / "fromslurm" / "hosts.yml").read_text()
    assert "2 of 2 node(s) answered" in text and "worker-0" in text and "worker-1" in text, text
