"""Every variable Ansible's ssh connection (and its sudo become plugin) reads is classified in
inventory/connvars.py: the list is derived from the installed ansible-core's own documentation
(`ansible-doc --json`, requirements/ansible.txt), so a release that adds one fails here until
it is classified. Then: the value-dependent rules, the ssh-argument options that would send
nodeprep elsewhere, the refusal at host selection (one line: host, variable, file:line, fix),
and `invoke inventory --host` naming each variable's class."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep.commands.common import select_hosts
from nodeprep.commands.options import InventoryOptions
from nodeprep.errors import InputError
from nodeprep.inventory import connvars, load
from nodeprep.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_DOC = ROOT / ".venv-ansible" / "bin" / "ansible-doc"


def documented(kind: str, plugin: str) -> set[str]:
    if not ANSIBLE_DOC.exists():
        pytest.fail(f"{ANSIBLE_DOC} is missing: run `sh requirements/bootstrap.sh`", pytrace=False)
    r = subprocess.run(
        [str(ANSIBLE_DOC), "-t", kind, plugin, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    opts = json.loads(r.stdout)[plugin]["doc"]["options"]
    return {
        v["name"]
        for o in opts.values()
        for v in o.get("vars", [])
        if v["name"].startswith("ansible_")
    }


@pytest.mark.slow(reason="runs ansible-doc (about 3 s)")
def test_every_variable_ansible_documents_is_classified():
    names = documented("connection", "ssh") | documented("become", "sudo")
    assert (
        len(names) >= 40
        and {"ansible_private_key_file", "ansible_ssh_pass", "ansible_become_pass"} <= names
    )
    assert sorted(names - connvars.ansible_names()) == [], "classify these in inventory/connvars.py"
    # and the spellings nodeprep resolves are the ones Ansible documents for those options
    assert (
        set(connvars.STRONG)
        | {
            k
            for k in connvars.WEAK
            if k not in ("ansible_python_interpreter", "ansible_connection")
        }
        <= names
    )


def test_every_rule_says_what_it_does():
    for name, rule in connvars.TABLE.items():
        assert (
            rule.status in (connvars.USED, connvars.IGNORED, connvars.REFUSED)
            and len(rule.text) > 10
        ), name


@pytest.mark.parametrize(
    "name, value, status",
    [
        ("ansible_ssh_pass", "x", "refused"),
        ("ansible_private_key", "-----BEGIN", "refused"),
        ("ansible_become_method", "sudo", "ignored"),
        ("ansible_become_method", "su", "refused"),
        ("ansible_become_user", "root", "ignored"),
        ("ansible_become_user", "postgres", "refused"),
        ("ansible_ssh_common_args", "-o ControlMaster=auto -o ServerAliveInterval=30", "used"),
        ("ansible_ssh_common_args", "-o ProxyJump=bastion", "used"),
        ("ansible_ssh_extra_args", "-i /keys/other", "refused"),
        ("ansible_ssh_extra_args", "-l other", "refused"),
        ("ansible_ssh_args", "-o User=other", "refused"),
        ("ansible_ssh_args", "-oPort=2222", "refused"),
        ("ansible_ssh_common_args", "-o 'HostName 10.9.9.9'", "refused"),
        ("ansible_ssh_args", "-F /etc/other", "refused"),
        ("ansible_ssh_timeout", 30, "ignored"),
        ("ansible_host_key_checking", False, "ignored"),
        ("ansible_python_interpreter", "/usr/bin/python3", "used"),
        ("my_playbook_var", 1, None),
    ],
)
def test_classify(name, value, status):
    rule = connvars.classify(name, value)
    assert (rule.status if rule else None) == status


def write(tmp_path, text: str) -> Path:
    p = tmp_path / "hosts.ini"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    "line, variable, fix",
    [
        ("n1 ansible_ssh_pass=hunter2", "ansible_ssh_pass", "ssh-copy-id"),
        ("n1 ansible_become_method=su", "ansible_become_method", "sudo -n"),
        (
            "n1 ansible_ssh_extra_args='-i /keys/x'",
            "ansible_ssh_extra_args",
            "ansible_ssh_private_key_file",
        ),
        ("n1 ansible_ssh_executable=/opt/tsh-ssh", "ansible_ssh_executable", "proxy_jump"),
    ],
)
def test_a_refused_variable_fails_in_one_line_with_host_origin_and_fix(
    tmp_path, line, variable, fix
):
    inv = write(tmp_path, f"[g]\n{line}\n")
    with pytest.raises(InputError) as e:
        select_hosts(str(inv), None, Settings(project_root=str(ROOT)))
    text = str(e.value)
    assert (
        f"{inv}:2" in f"{e.value.file}:{e.value.line}"
        and f"host n1: {variable}" in text
        and fix in text
    ), text
    assert "hunter2" not in text


def test_the_secret_of_a_refused_password_is_never_shown(tmp_path, capsys):
    inv = write(tmp_path, "[g]\nn1 ansible_password=hunter2 ansible_become_pass=s3cret\n")
    assert (
        api.inventory(
            InventoryOptions(inventory=str(inv), host="n1"), Settings(project_root=str(ROOT))
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "hunter2" not in out and "s3cret" not in out
    assert "(refused: a password" in out and "(refused: a sudo password" in out


def test_inventory_host_lists_each_class(tmp_path, capsys):
    inv = write(
        tmp_path,
        "[g]\nn1 ansible_ssh_timeout=30 ansible_ssh_common_args='-o ProxyJump=b' http_port=80\n",
    )
    assert (
        api.inventory(
            InventoryOptions(inventory=str(inv), host="n1", json=True),
            Settings(project_root=str(ROOT)),
        )
        == 0
    )
    got = json.loads(capsys.readouterr().out)["variables"]
    assert (
        got["ansible_ssh_timeout"]["class"] == "ignored"
        and "--connect-timeout" in got["ansible_ssh_timeout"]["why"]
    )
    assert (
        got["ansible_ssh_common_args"]["class"] == "used" and got["ansible_ssh_common_args"]["used"]
    )
    assert "class" not in got["http_port"] and got["http_port"]["used"] is False


def test_the_ssh_spelling_wins_at_any_level(tmp_path):
    """Ansible's order (the last of an option's vars that is defined wins); the differential
    test checks it against ansible-inventory on the corpus's *_connection_spellings entries."""
    inv = write(
        tmp_path,
        "[all:vars]\nansible_ssh_user=strong\nansible_port=2200\n[g]\n"
        "n1 ansible_user=weak ansible_ssh_port=22 ansible_private_key_file=k1\n"
        "n2 ansible_ssh_private_key_file=/k2 ansible_private_key_file=/k1\n",
    )
    h1, h2 = load(str(inv), root=ROOT).hosts
    assert (h1.user, h1.port, h1.key) == ("strong", 22, str(tmp_path / "k1"))
    assert (h2.user, h2.port, h2.key) == ("strong", 2200, "/k2")
    assert h1.origin["user"].endswith("hosts.ini:2") and h1.origin["port"].endswith("hosts.ini:5")


def test_the_documented_table_names_every_variable():
    text = (ROOT / "docs" / "inventory.md").read_text()
    assert [n for n in connvars.TABLE if f"`{n}`" not in text] == []
