"""Ansible's connection variables in their other spellings, on the lab: an Ansible INI
inventory whose key is given only as `ansible_private_key_file`, whose user and port are given
as `ansible_ssh_user` / `ansible_ssh_port` beside wrong `ansible_user` / `ansible_port` at a
more specific level (Ansible's ssh spelling wins at any level), whose address is
`ansible_ssh_host` beside a wrong `ansible_host`, and whose `ansible_python_interpreter` names
another interpreter path than the lab's default: provision, verify-parity and train (deepspeed)
use it unchanged. `ansible_connection=local` is tests/integration/test_local.py."""

from __future__ import annotations

import json

from nodeprep import cli as api
from nodeprep.commands.options import FactsOptions, ProvisionOptions, TrainOptions, VerifyOptions

SECOND_PYTHON = "/usr/bin/python3.11"  # the lab's default is /usr/bin/python3


def test_other_spellings_provision_verify_and_train(
    provisioned, lab, lab_settings, tmp_path, capfd
):
    nodes = lab.nodes[:2]
    inv = tmp_path / "hosts.ini"
    inv.write_text(
        "[gpus]\n"
        + "".join(
            f"{n.name} ansible_ssh_host={n.address} "
            "ansible_host=192.0.2.99 ansible_user=nobody ansible_port=2200\n"
            for n in nodes
        )
        + f"[all:vars]\nansible_ssh_user={lab.user}\nansible_ssh_port=22\n"
        f"ansible_private_key_file={lab.key}\nansible_python_interpreter={SECOND_PYTHON}\n"
        "torch_index=pip-config\n"
    )  # the lab reaches no PyTorch index (as its own inventory says)
    assert api.facts(FactsOptions(inventory=str(inv), json=True), lab_settings) == 0
    rep = json.loads(capfd.readouterr().out)
    assert {n: v["facts"]["python"]["path"] for n, v in rep["nodes"].items()} == {
        n.name: SECOND_PYTHON for n in nodes
    }
    assert api.provision(ProvisionOptions(inventory=str(inv), sets=provisioned), lab_settings) == 0
    assert api.verify_parity(VerifyOptions(inventory=str(inv)), lab_settings) == 0
    code = api.train(
        TrainOptions(
            inventory=str(inv), limit=None, launcher="deepspeed", payload="health", timeout=180
        ),
        lab_settings,
    )
    text = "".join(capfd.readouterr())
    assert code == 0 and "health: OK world_size=2" in text, text[-3000:]
