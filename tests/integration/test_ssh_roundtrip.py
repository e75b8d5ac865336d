"""The controller's ssh config after `provision`, judged by OpenSSH itself: `ssh -G NODE` gives
the address, port, user and key nodeprep used, whatever the user's own blocks before or after
nodeprep's say (ssh takes the first value it finds), the user's lines stay byte for byte, and
`ssh NODE` really logs in with pinned host keys."""

from __future__ import annotations

import subprocess

from nodeprep import cli as api
from nodeprep.commands.options import ProvisionOptions
from nodeprep.engine.steps import without_block
from nodeprep.inventory import load, openssh

BEFORE = (
    "# my defaults\nHost *\n    User alice\n    IdentityFile ~/.ssh/alice_key\n    Port 2222\n"
    "    ServerAliveInterval 30\n\n"
)
P = "t-"  # conftest's lab is named "t": a named lab's ssh_alias_prefix makes its aliases t-worker-N
AFTER = (
    f"Host {P}worker-*\n    User bob\n    HostName 192.0.2.99\n    Port 2200\n"
    "    ProxyJump gateway\n"
)


def _provision(lab, lab_settings, ctl, cfg) -> int:
    sets = (f"controller_key={ctl}/id", f"controller_ssh_config={cfg}")
    return api.provision(
        ProvisionOptions(
            inventory=str(lab.inventory), limit=None, roles="ssh_keys,ssh_config", sets=sets
        ),
        lab_settings,
    )


def _ssh_g(cfg, name) -> openssh.Resolved:
    r = subprocess.run(
        ["ssh", "-G", "-F", str(cfg), name],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    return openssh.parse(name, r.stdout)


def test_ssh_G_gives_what_nodeprep_used_with_user_blocks_around(lab, lab_settings, tmp_path):
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    cfg = ctl / "config"
    cfg.write_text(BEFORE + AFTER)
    assert _provision(lab, lab_settings, ctl, cfg) == 0
    text = cfg.read_text()
    block_name = next(line for line in text.splitlines() if line.startswith("# BEGIN"))[
        len("# BEGIN nodeprep ") :
    ]
    block_name = block_name.removesuffix(" (managed: edits inside this block are replaced)")
    assert without_block(text, block_name) == BEFORE + AFTER  # the user's bytes, untouched
    inv = load(str(lab.inventory))
    for host in inv.hosts:
        got = _ssh_g(cfg, P + host.name)
        assert (got.hostname, got.port, got.user) == (host.address, host.port, host.user)
        assert got.identity_files[0] == str(host.key)  # the key nodeprep used
        assert got.proxyjump is None or got.proxyjump == "gateway"
    # other hosts still get the user's defaults: the block ends with `Match all`
    other = _ssh_g(cfg, "somewhere-else")
    assert (other.user, other.port) == ("alice", 2222)
    r = subprocess.run(
        [
            "ssh",
            "-F",
            str(cfg),
            "-o",
            "BatchMode=yes",
            "-o",
            "ProxyJump=none",
            P + lab.nodes[0].name,
            "hostname",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0 and r.stdout.strip() == lab.nodes[0].name, r.stderr


def test_a_block_below_the_users_lines_moves_first(lab, lab_settings, tmp_path):
    """A config from before this rule (the block at the end, after `Host *`) gets the block
    moved first; the user's lines stay as they were, and a second run changes nothing."""
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    cfg = ctl / "config"
    assert _provision(lab, lab_settings, ctl, cfg) == 0
    ours = cfg.read_text()
    cfg.write_text(BEFORE + ours + AFTER)  # where it stood before: below `Host *`
    assert _ssh_g(cfg, P + lab.nodes[1].name).user == "alice"
    assert _provision(lab, lab_settings, ctl, cfg) == 0
    assert cfg.read_text() == ours + BEFORE + AFTER
    assert _ssh_g(cfg, P + lab.nodes[1].name).user != "alice"
    assert _provision(lab, lab_settings, ctl, cfg) == 0 and cfg.read_text() == ours + BEFORE + AFTER
