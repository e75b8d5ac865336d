"""Jump hosts from every place users write them (inventory/jumps.py): nodeprep's proxy_jump,
Ansible's ssh arguments (-o ProxyJump=, -J, a plain ssh -W ProxyCommand) and the ssh config's
ProxyJump/ProxyCommand; a chain; the forms refused in one line naming what is accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeprep.errors import InputError
from nodeprep.inventory import jumps
from nodeprep.inventory.jumps import Hop
from nodeprep.inventory.model import load


@pytest.mark.parametrize(
    "text,want",
    [
        ("bastion", (Hop("bastion"),)),
        ("ops@bastion.example.com:2222", (Hop("bastion.example.com", 2222, "ops"),)),
        ("ssh://ops@10.0.0.5:2200", (Hop("10.0.0.5", 2200, "ops"),)),
        ("a@outer:2201,inner", (Hop("outer", 2201, "a"), Hop("inner"))),
        ("[2001:db8::1]:2222", (Hop("2001:db8::1", 2222),)),
        ("none", ()),
    ],
)
def test_proxy_jump_values(text, want):
    assert jumps.parse_chain(text) == want


@pytest.mark.parametrize("bad", ["ops@", "host:0", "host:99999", "a b", "@host"])
def test_bad_hops(bad):
    with pytest.raises(ValueError):
        jumps.parse_chain(bad)


@pytest.mark.parametrize(
    "args,want",
    [
        ("-o ProxyJump=ops@bastion:2222", (Hop("bastion", 2222, "ops"),)),
        ("-o StrictHostKeyChecking=yes -o 'ProxyJump ops@bastion'", (Hop("bastion", 22, "ops"),)),
        ("-oProxyJump=bastion", (Hop("bastion"),)),
        ("-J jump1,jump2:2200", (Hop("jump1"), Hop("jump2", 2200))),
        ("-Jops@jump", (Hop("jump", 22, "ops"),)),
        (
            '-o ProxyCommand="ssh -W %h:%p -q ops@bastion.example.com"',
            (Hop("bastion.example.com", 22, "ops"),),
        ),
        ("-o ProxyCommand='ssh -W %h:%p -p 2222 -l ops bastion'", (Hop("bastion", 2222, "ops"),)),
        ("-o ServerAliveInterval=30", ()),
    ],
)
def test_ansible_ssh_args(args, want):
    assert jumps.of_host("n", {}, {"ansible_ssh_common_args": args}, {}) == want


def test_proxy_jump_wins_and_the_ssh_config_is_read():
    assert jumps.of_host("n", {"proxy_jump": "a"}, {"ansible_ssh_common_args": "-J b"}, {}) == (
        Hop("a"),
    )
    assert jumps.of_host("n", {}, {"proxyjump": "ops@b:2"}, {}) == (Hop("b", 2, "ops"),)
    assert jumps.of_host("n", {}, {"proxycommand": "/usr/bin/ssh -W %h:%p gw"}, {}) == (Hop("gw"),)
    assert jumps.of_host("n", {"proxy_jump": ["a", "ops@b:2200"]}, {}, {}) == (
        Hop("a"),
        Hop("b", 2200, "ops"),
    )


@pytest.mark.parametrize(
    "extra",
    [
        {"proxycommand": "nc -X connect -x proxy:8080 %h %p"},
        {"ansible_ssh_common_args": "-o ProxyCommand='ssh -W %h:%p -i key gw'"},
        {"ansible_ssh_extra_args": "-o ProxyCommand='aws ssm start-session --target %h'"},
    ],
)
def test_other_proxy_commands_are_unsupported_naming_the_accepted_form(extra):
    with pytest.raises(jumps.Unsupported) as e:
        jumps.of_host("gpu1", {}, extra, {})
    assert e.value.variable == next(iter(extra)) and "ProxyJump [user@]host[:port]" in e.value.why


def test_an_unsupported_jump_is_refused_when_selected_and_the_inventory_still_loads(
    tmp_path, monkeypatch
):
    """As for Ansible connections nodeprep lacks: `invoke inventory` shows the host, a command
    that selects it is refused in one line naming file:line; the other hosts go on."""
    from nodeprep.commands.common import select_hosts
    from nodeprep.settings import Settings

    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts.ini").write_text(
        "[gpus]\ngpu01 ansible_host=10.0.0.1\n"
        "gpu02 ansible_ssh_common_args='-o ProxyCommand=\"cloudflared access ssh --hostname %h\"'\n"
    )
    inv = load("hosts.ini")
    assert (
        inv.host("gpu02").jump == ()
        and inv.host("gpu02").jump_problem[0] == "ansible_ssh_common_args"
    )
    settings = Settings(project_root=str(Path(__file__).resolve().parents[2]))
    assert [h.name for h in select_hosts("hosts.ini", "gpu01", settings)[1]] == ["gpu01"]
    with pytest.raises(InputError) as e:
        select_hosts("hosts.ini", "gpu02", settings)
    assert str(e.value).startswith(
        "hosts.ini:3: host gpu02: ansible_ssh_common_args"
    ) and "ProxyJump" in str(e.value)
    assert e.value.exit_code == 2


def test_inventory_hosts_carry_their_chain(tmp_path):
    ini = tmp_path / "hosts.ini"
    ini.write_text(
        "[gpus]\ngpu1 ansible_host=10.0.0.11\n"
        "[gpus:vars]\nansible_ssh_common_args='-o ProxyJump=ops@bastion.example.com:2222'\n"
    )
    inv = load(str(ini))
    assert inv.host("gpu1").jump == (Hop("bastion.example.com", 2222, "ops"),)
    native = tmp_path / "n.yml"
    native.write_text("vars: {proxy_jump: 'ops@b1,b2:2200'}\nhosts: {w0: {address: 10.0.0.1}}\n")
    assert load(str(native)).host("w0").jump == (Hop("b1", 22, "ops"), Hop("b2", 2200))
    bad = tmp_path / "b.yml"
    bad.write_text("vars: {proxy_jump: 'ops@-oProxyCommand=x'}\nhosts: {w0: {address: 10.0.0.1}}\n")
    with pytest.raises(InputError) as e:
        load(str(bad))
    assert "jump host" in str(e.value) and e.value.line == 1
