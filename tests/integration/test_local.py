"""`ansible_connection=local`: the controller itself as a node, reached without ssh. The
commands really run here (HOME is a temporary directory, so the node's home is that)."""

from __future__ import annotations

import json

from nodeprep import cli as api
from nodeprep.commands.options import FactsOptions, ProvisionOptions
from nodeprep.settings import Settings


def test_local_node_gets_facts_and_is_provisioned_without_ssh(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    inv = tmp_path / "hosts.ini"
    inv.write_text("[me]\nlocalhost ansible_connection=local ansible_user=nobody-at-all\n")
    settings = Settings(state_dir=str(tmp_path / "state"))
    assert api.facts(FactsOptions(inventory=str(inv), json=True), settings) == 0
    rep = json.loads(capsys.readouterr().out)
    facts = rep["nodes"]["localhost"]["facts"]
    assert facts["python"]["version"].startswith("3.") and facts["os"]["arch"]
    # no ssh was involved: nothing was pinned, and the user in the inventory was not used
    assert not settings.known_hosts.exists() or settings.known_hosts.read_text() == ""

    def provision():
        code = api.provision(
            ProvisionOptions(inventory=str(inv), roles="shell,nccl", json=True), settings
        )
        return code, json.loads(capsys.readouterr().out)

    code, rep = provision()
    assert code == 0 and rep["nodes"]["localhost"]["status"] == "changed", rep
    assert "nodeprep" in (home / ".nodeprep" / "env.sh").read_text()
    assert "nodeprep env" in (home / ".bashrc").read_text()
    code, rep = provision()
    assert code == 0 and rep["changed"] == 0, rep


def test_a_local_node_among_others_is_refused_with_the_fix(tmp_path, capsys):
    inv = tmp_path / "hosts.ini"
    inv.write_text("[gpus]\ngpu01 ansible_host=192.0.2.10\nlocalhost ansible_connection=local\n")
    assert api.facts(FactsOptions(inventory=str(inv)), Settings(state_dir=str(tmp_path / "s"))) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"error: {inv}:3: host localhost: connection local")
    assert "--limit localhost" in err[0]
