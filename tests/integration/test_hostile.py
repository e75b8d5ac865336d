"""Hostile values on the real lab: every value of the corpus (tests/unit/test_hostile.py) that
validation accepts for deepspeed_env and nccl_env, and a hostile env_file path, are provisioned
onto the nodes, then a payload prints what each rank sees under every launcher. Each value
must arrive literally (DeepSpeed strips surrounding whitespace, as documented); no canary file
may appear on any node or on the controller."""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path

import pytest
import yaml

from nodeprep import cli as api
from nodeprep.commands.options import ProvisionOptions, TrainOptions
from nodeprep.commands.provision import validated
from nodeprep.engine.events import Events
from nodeprep.errors import NodeprepError
from nodeprep.settings import Settings
from tests.unit.test_hostile import CANARY as UNIT_CANARY
from tests.unit.test_hostile import HOSTILE

NODES = "worker-[0-1]"
CANARY = f"/tmp/nodeprep-canary-{uuid.uuid4().hex[:8]}"
VALUES = {case: value.replace(UNIT_CANARY, CANARY) for case, value in HOSTILE.items()}
ENV_FILE = f"~/.nodeprep/env $(touch {CANARY}) `touch {CANARY}`;'x\".sh"
PAYLOAD = """import json, os
seen = {k: v for k, v in os.environ.items() if k.startswith(("H_", "NCCL_H_"))}
print("HOSTILE " + json.dumps(seen, sort_keys=True), flush=True)
"""


def _accepted(base: dict, tmp: Path, var: str, prefix: str) -> dict:
    """{NAME: value} of the corpus values validation accepts for VAR (each tried alone)."""
    out = {}
    for case, value in VALUES.items():
        doc = json.loads(json.dumps(base))
        doc.setdefault("vars", {})[var] = {f"{prefix}{case.upper()}": value}
        path = tmp / "one.yml"
        path.write_text(yaml.safe_dump(doc, allow_unicode=True), "utf-8")
        try:
            validated(
                ProvisionOptions(inventory=str(path), roles="deepspeed_env,nccl"),
                Settings(state_dir=str(tmp / "state")),
                Events(),
            )
        except NodeprepError as err:
            assert err.exit_code == 2 and "\n" not in str(err)
            continue
        out[f"{prefix}{case.upper()}"] = value
    return out


def _canaries(lab, lab_ssh=None) -> list[str]:
    """Canary files on the controller and (with LAB_SSH) on every node, as each sees /tmp."""
    found = [CANARY] if os.path.exists(CANARY) else []
    for node in lab.nodes if lab_ssh else []:
        r = lab_ssh(node, f"ls -d {CANARY}* 2>/dev/null || true")
        found += [f"{node.name}: {line}" for line in r.stdout.split() if line]
    return found


@pytest.fixture(scope="module")
def hostile(provisioned, lab, lab_settings, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    base = yaml.safe_load(Path(lab.inventory).read_text())
    ds = _accepted(base, tmp, "deepspeed_env", "H_")
    nccl = _accepted(base, tmp, "nccl_env", "NCCL_H_")
    assert len(ds) >= 10 and len(nccl) >= 10, (ds, nccl)
    doc = json.loads(json.dumps(base))
    doc.setdefault("vars", {}).update(deepspeed_env=ds, nccl_env=nccl, env_file=ENV_FILE)
    inv = tmp / "hosts.yml"
    inv.write_text(yaml.safe_dump(doc, allow_unicode=True), "utf-8")
    script = tmp / "show_env.py"
    script.write_text(PAYLOAD)
    code = api.provision(ProvisionOptions(inventory=str(inv), sets=provisioned), lab_settings)
    assert code == 0
    assert _canaries(lab) == []
    yield inv, script, ds, nccl
    # put the lab back as the other modules expect it: default env file, no hostile values
    assert (
        api.provision(
            ProvisionOptions(inventory=str(lab.inventory), sets=provisioned), lab_settings
        )
        == 0
    )
    for node in lab.nodes:
        for stray in Path(node.home, ".nodeprep").glob("env $(touch*"):
            shutil.rmtree(stray) if stray.is_dir() else stray.unlink()
    assert _canaries(lab) == []


def _seen(out: str) -> list[dict]:
    return [json.loads(m.group(1)) for m in re.finditer(r"HOSTILE (\{.*\})$", out, re.M)]


def test_env_file_path_arrives_literally(hostile, lab, lab_ssh):
    assert _canaries(lab, lab_ssh) == []  # after provision, on every node too
    for node in lab.nodes:
        path = Path(node.home) / ENV_FILE[2:]
        assert path.is_file(), path
        assert "NCCL_H_SEMICOLON" in path.read_text()


@pytest.mark.parametrize(
    "launcher,ds_launcher", [("deepspeed", "pdsh"), ("torchrun", "pdsh"), ("mpirun", "pdsh")]
)
def test_values_reach_every_rank_literally(
    hostile, lab, lab_settings, lab_ssh, capfd, launcher, ds_launcher
):
    inv, script, ds, nccl = hostile
    code = api.train(
        TrainOptions(
            inventory=str(inv),
            limit=NODES,
            launcher=launcher,
            payload=str(script),
            timeout=120,
            ds_launcher=ds_launcher,
        ),
        lab_settings,
    )
    out = capfd.readouterr()
    text = out.out + out.err
    assert code == 0, text
    seen = _seen(text)
    assert len(seen) == 2, text
    # DeepSpeed's runner exports ~/.deepspeed_env (stripped values); the other launchers carry
    # what the env file exports, byte for byte
    want = (
        {**{k: v.strip() for k, v in ds.items()}, **{k: v.strip() for k, v in nccl.items()}}
        if launcher == "deepspeed"
        else nccl
    )
    for rank in seen:
        assert {k: rank.get(k) for k in want} == want
    assert _canaries(lab, lab_ssh) == []


def test_deepspeed_openmpi_refuses_values_it_would_change(
    hostile, lab, lab_settings, lab_ssh, capfd
):
    """DeepSpeed's openmpi runner double-quotes odd values into mpirun -x (no shell), so the
    ranks would get the quotes too: the preflight names every such value before launching."""
    inv, script, ds, nccl = hostile
    code = api.train(
        TrainOptions(
            inventory=str(inv),
            limit=NODES,
            launcher="deepspeed",
            payload=str(script),
            timeout=120,
            ds_launcher="openmpi",
        ),
        lab_settings,
    )
    out = capfd.readouterr()
    text = out.out + out.err
    assert code == 1 and "preflight failed" in text and "Traceback" not in text
    assert "openmpi launcher" in text and _seen(text) == []
    assert _canaries(lab, lab_ssh) == []


@pytest.fixture
def slurm(hostile, lab_up):
    from nodeprep.lab import slurm as lab_slurm

    if not lab_slurm.cgroup_controllers():
        pytest.skip(
            "this host mounts no cgroup v1 controllers: "
            "Slurm 22.05's slurmd cannot start in the lab"
        )
    lab_up(slurm=True)
    yield
    lab_up(slurm=False)


def test_values_reach_srun_ranks_literally(hostile, slurm, lab, lab_settings, lab_ssh, capfd):
    inv, script, _ds, nccl = hostile
    code = api.train(
        TrainOptions(
            inventory=str(inv), limit=NODES, launcher="srun", payload=str(script), timeout=120
        ),
        lab_settings,
    )
    out = capfd.readouterr()
    text = out.out + out.err
    assert code == 0, text
    seen = _seen(text)
    assert len(seen) == 2 and all({k: r.get(k) for k in nccl} == nccl for r in seen), text
    assert _canaries(lab, lab_ssh) == []
