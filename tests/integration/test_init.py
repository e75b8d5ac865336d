"""`invoke init` on the provisioned lab: from an Ansible INI inventory (groups kept), from an ssh
config (`sshconfig:FILE`) and from a DeepSpeed hostfile plus --set for what a hostfile does not
say, each node contacted once; the file written is then used unchanged by provision (nothing
to change: the lab is provisioned), verify-parity and train. An existing inventory is refused
without --force. The inventories go to a scratch project directory (roles linked to the
repo's), not the repo's inventory/."""
from __future__ import annotations

import dataclasses

import pytest

from nodeprep import cli as api
from nodeprep.commands.options import InitOptions, ProvisionOptions, TrainOptions, VerifyOptions

ROOT_ROLES = __import__("pathlib").Path(__file__).resolve().parents[2] / "roles"


@pytest.fixture(scope="module")
def project(tmp_path_factory, lab_settings):
    p = tmp_path_factory.mktemp("initproj")
    (p / "roles").symlink_to(ROOT_ROLES)
    (p / "inventory").mkdir()
    return p, dataclasses.replace(lab_settings, project_root=str(p))


def sources(lab, base) -> dict[str, tuple[str, tuple[str, ...]]]:
    nodes = lab.nodes[:2]
    ini = base / "ansible.ini"
    ini.write_text("[gpus]\n" + "".join(f"{n.name} ansible_host={n.address}\n" for n in nodes) +
                   f"[all:vars]\nansible_user=nodeprep\nansible_ssh_private_key_file={lab.key}\n")
    cfg = base / "ssh_config"
    cfg.write_text("".join(f"Host {n.name}\n    HostName {n.address}\n    User nodeprep\n"
                           f"    IdentityFile {lab.key}\n" for n in nodes))
    hf = base / "hostfile"
    hf.write_text("".join(f"{n.address} slots=1\n" for n in nodes))
    return {"ansible": (str(ini), ()), "sshconfig": (f"sshconfig:{cfg}", ()),
            "hostfile": (f"hostfile:{hf}", ("user=nodeprep", f"key={lab.key}"))}


@pytest.mark.parametrize("form", ["ansible", "sshconfig", "hostfile"])
def test_init_then_provision_verify_and_train_use_it_unchanged(provisioned, lab, lab_settings, project, capfd,
                                                               form):
    base, init_settings = project
    source, sets = sources(lab, base)[form]
    name = f"from{form}"
    assert api.init(InitOptions(name, source, sets=sets), init_settings) == 0
    out = capfd.readouterr().out
    path = base / "inventory" / name / "hosts.yml"
    assert f"wrote {path}" in out and f"invoke provision --inventory {name}" in out, out
    text = path.read_text()
    assert "2 of 2 node(s) answered" in text and "torch-plan: x86_64 torch==" in text, text
    if form == "ansible":
        assert "groups:\n  gpus: {hosts: [worker-0, worker-1]}" in text, text
    # a second init of the same name is refused, --force replaces it
    assert api.init(InitOptions(name, source, sets=sets), init_settings) == 2
    assert "exists" in capfd.readouterr().err
    inv = str(path)
    assert api.provision(ProvisionOptions(inv, sets=provisioned), lab_settings) == 0
    assert api.verify_parity(VerifyOptions(inv), lab_settings) == 0
    code = api.train(TrainOptions(inv, None, "deepspeed", "health", timeout=180), lab_settings)
    text = "".join(capfd.readouterr())
    assert code == 0 and "health: OK world_size=2" in text, text[-3000:]
