"""`invoke doctor` as data: the controller's checks over Views, the first contact's checks over
Contacts (each code, and the fix it names), a crashing check isolated, the text rendering, and
`ssh.prune` keeping everything but the stale blocks byte for byte. The real faults (a stopped
node, a changed host key, no sudo, pdsh off the non-interactive PATH, a full disk, a stale block,
a conflicting alias) and their fixes run on the lab: tests/integration/test_doctor.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from nodeprep.cli import doctor_text
from nodeprep.commands import doctor as doctor_cmd
from nodeprep.commands.options import DoctorOptions, PruneOptions
from nodeprep.commands.ssh_prune import prune
from nodeprep.engine import facts as factmod
from nodeprep.engine.events import Events
from nodeprep.engine.facts import FactValues
from nodeprep.errors import InputError
from nodeprep.ops.doctor import catalogue, connection, node
from nodeprep.ops.doctor import controller as ctl
from nodeprep.ops.doctor import controller_view as cview
from nodeprep.ops.health.findings import CheckSpec, Verdict
from nodeprep.ops.ssh import config_blocks
from nodeprep.settings import Settings


def view(**kw) -> cview.View:
    base = dict(
        ssh_dir="/home/u/.ssh",
        ssh_dir_mode=0o700,
        keys=[cview.KeyFile("/k/id", "default", True, mode=0o600, encrypted=False)],
        agent_sock=None,
        agent_rc=None,
        agent_keys=0,
        config_path="/home/u/.ssh/config",
        config_mode=0o600,
    )
    base.update(kw)
    return cview.View(**base)


def codes(got) -> list[str]:
    return [g[-4] for g in got if g[-3] is not Verdict.OK]


# -- controller -----------------------------------------------------------------------------


def test_a_clean_controller_has_no_finding():
    v = view()
    assert (
        codes(
            ctl.ssh_keys(v)
            + ctl.ssh_agent(v)
            + ctl.ssh_config(v)
            + ctl.python_deps(v)
            + ctl.labs(v)
        )
        == []
    )


@pytest.mark.parametrize(
    "kw, code, fix",
    [
        ({"ssh_dir_mode": 0o777}, "SSH_DIR_MODE", "chmod 700 /home/u/.ssh"),
        (
            {"keys": [cview.KeyFile("/k/id", "default", True, mode=0o644, encrypted=False)]},
            "KEY_MODE",
            "chmod 600 /k/id",
        ),
        (
            {"keys": [cview.KeyFile("/k/gone", "key: of inv.yml:3", False)]},
            "KEY_MISSING",
            "ssh-keygen -t ed25519 -N '' -f /k/gone",
        ),
        (
            {"keys": [cview.KeyFile("/k/id", "default", True, mode=0o600, encrypted=True)]},
            "KEY_LOCKED",
            "ssh-add /k/id",
        ),
        ({"keys": []}, "NO_KEY", "ssh-keygen"),
    ],
)
def test_key_findings_name_their_fix(kw, code, fix):
    got = [g for g in ctl.ssh_keys(view(**kw)) if g[1] is not Verdict.OK]
    assert [g[0] for g in got] == [code] and fix in got[0][3]


def test_a_locked_key_is_fine_when_the_agent_holds_keys():
    v = view(
        keys=[cview.KeyFile("/k/id", "default", True, mode=0o600, encrypted=True)],
        agent_sock="/s",
        agent_rc=0,
        agent_keys=1,
    )
    assert codes(ctl.ssh_keys(v)) == []


def test_a_dead_agent_is_a_warning_with_the_fix():
    got = ctl.ssh_agent(view(agent_sock="/tmp/gone.sock", agent_rc=2))
    assert got[0][:2] == ("AGENT_DEAD", Verdict.WARN) and "ssh-agent -s" in got[0][3]


def test_stale_blocks_and_conflicts_name_prune_or_the_prefix(tmp_path):
    stale = config_blocks.Defined(
        "worker-0", "10.9.0.10", None, where="/c:2 (the block of inventory 'old')", block="old"
    )
    mine = config_blocks.Defined("worker-1", "192.0.2.5", None, where="/c:9", block=None)
    v = view(
        blocks=[("old", 1, False), ("lab", 5, True)],
        inventory="lab",
        label="lab",
        aliases=[
            cview.Alias("worker-0", "10.1.0.10", 22, [stale]),
            cview.Alias("worker-1", "10.1.0.11", 22, [mine]),
        ],
    )
    got = {(g[0], g[3]) for g in ctl.ssh_config(v)}
    assert ("BLOCK_STALE", "invoke ssh.prune") in got
    assert any(c == "ALIAS_CONFLICT" and fix.startswith("invoke ssh.prune") for c, fix in got)
    assert any(
        c == "ALIAS_CONFLICT" and "ssh_alias_prefix: lab-" in fix and "/c:9" in fix
        for c, fix in got
    )
    v.prefix = "lab-"  # the prefix it has already: another one is suggested
    assert (
        "ssh_alias_prefix: lab2-"
        in [g for g in ctl.ssh_config(v) if g[0] == "ALIAS_CONFLICT"][-1][3]
    )


def test_a_config_others_may_write_is_refused_as_ssh_does():
    got = ctl.ssh_config(view(config_mode=0o666))
    assert got[0][0] == "CONFIG_MODE" and got[0][3] == "chmod 600 /home/u/.ssh/config"


def test_dependencies_against_the_pins():
    got = ctl.python_deps(
        view(
            deps=[
                ("fabric", "3.2.3", "3.2.3"),
                ("invoke", "2.2.1", "2.0.0"),
                ("rich", "15.0.0", None),
            ],
            python=(3, 9, 2),
        )
    )
    assert codes(got) == ["PYTHON_OLD", "DEP_VERSION", "DEP_MISSING"]


def test_look_reads_real_key_files_and_the_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    (tmp_path / ".ssh").mkdir(mode=0o700)
    key = tmp_path / ".ssh" / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(key)], check=True
    )
    os.chmod(key, 0o640)
    cfg = tmp_path / ".ssh" / "config"
    cfg.write_text(
        "# BEGIN nodeprep hosts gone (managed: edits inside this block are replaced)\nHost a\n"
        "    HostName 192.0.2.1\n# END nodeprep hosts gone\n"
    )
    v = cview.look(tmp_path, cfg)
    assert [(k.path, k.mode, k.encrypted) for k in v.keys] == [(str(key), 0o640, True)]
    assert v.blocks == [("gone", 1, False)] and v.agent_sock is None
    assert codes(ctl.ssh_keys(v)) == ["KEY_MODE"]


# -- first contact --------------------------------------------------------------------------


def contact(name="n1", reached=True, facts=None, **kw) -> node.Contact:
    base = {
        "user": {"name": "u", "uid": 1000, "home": "/home/u"},
        "login_shell": "/bin/bash",
        "python": {"path": "/usr/bin/python3", "version": "3.11.2", "glibc": "2.36"},
        "os": {"release": "Debian GNU/Linux 12 (bookworm)", "kernel": "6.1", "arch": "x86_64"},
        "programs": {"pdsh", "mpirun", "orted"},
        "gpus": {"count": 0},
        "room": {
            "dir": "/home/u",
            "mount": "/home",
            "free": 50 * 2**30,
            "size": 100 * 2**30,
            "inodes_free": 10**6,
            "writable": True,
            "readonly": False,
        },
        "venv": {"exists": False},
        "sudo": "usermod",
        "login_finds": {},
    }
    base.update(facts or {})
    return node.Contact(
        name,
        "10.0.0.1",
        22,
        user="u",
        key="/k/id",
        vars={"login_shell": None, "python": "python3"},
        reached=reached,
        login={"method": "publickey", "host_key": "SHA256:x", "pinned_now": False},
        facts=FactValues(base),
        **kw,
    )


def run_all(contacts) -> list:
    return [g for c in catalogue.CHECKS if c.tier == "node" for g in c.run(contacts)]


def test_a_healthy_fleet_has_no_finding():
    assert codes(run_all([contact("n1"), contact("n2")])) == []


@pytest.mark.parametrize(
    "kind, code",
    [
        ("Unreachable", "NODE_UNREACHABLE"),
        ("AuthFailed", "AUTH_FAILED"),
        ("HostKeyChanged", "HOST_KEY_CHANGED"),
        ("UnknownHostKey", "HOST_KEY_UNPINNED"),
    ],
)
def test_a_node_not_reached_says_why_once_and_unknown_elsewhere(kind, code):
    got = run_all(
        [
            contact("n1"),
            contact(
                "n2", reached=False, error_kind=kind, message="why", inventory=" --inventory x"
            ),
        ]
    )
    mine = [g for g in got if g[0] == "n2"]
    assert [g[1] for g in mine if g[1] != "NOT_CHECKED"] == [code]
    assert {g[1] for g in mine if g[2] is Verdict.UNKNOWN} == {"NOT_CHECKED"}
    if code == "HOST_KEY_CHANGED":
        assert "invoke hosts.forget n2 --inventory x" in mine[0][4]


def test_sudo_is_asked_only_where_the_shell_must_change():
    c = contact(facts={"sudo": "none"})
    assert codes(node.sudo([c])) == []  # bash already: nothing to change
    c.vars["login_shell"] = "/bin/zsh"
    got = node.sudo([c])
    assert got[0][1] == "SUDO_MISSING" and "usermod -s /bin/zsh u" in got[0][4]
    assert codes(node.sudo([contact(facts={"sudo": "usermod", "login_shell": "/bin/tcsh"})])) == []
    assert (
        node.sudo([contact(facts={"sudo": None, "login_shell": "/bin/tcsh"})])[0][1]
        == "SUDO_UNKNOWN"
    )


def test_python_missing_old_and_mismatched():
    got = node.python(
        [
            contact("a"),
            contact("b"),
            contact("c", facts={"python": {"path": "/p", "version": "3.12.1"}}),
            contact("d", facts={"python": None}),
            contact("e", facts={"python": {"path": "/o", "version": "3.8.10"}}),
        ]
    )
    assert [(g[0], g[1]) for g in got if g[2] is not Verdict.OK] == [
        ("c", "PYTHON_MISMATCH"),
        ("d", "PYTHON_MISSING"),
        ("e", "PYTHON_OLD"),
    ]


def test_a_program_only_a_login_shell_finds_gets_the_path_fix():
    c = contact(
        "n2", facts={"programs": {"mpirun", "orted"}, "login_finds": {"pdsh": "/opt/pdsh/bin/pdsh"}}
    )
    got = node.launchers([contact("n1"), c])
    bad = [g for g in got if g[2] is not Verdict.OK]
    assert [(g[0], g[1]) for g in bad] == [("n2", "NOT_ON_PATH")]
    assert "at /opt/pdsh/bin/pdsh" in bad[0][3] and bad[0][4].startswith(
        "on n2: { echo 'export PATH=/opt/pdsh/bin:$PATH'"
    )


def test_a_program_nowhere_gets_the_package_for_its_os():
    rhel = contact("r", facts={"programs": set(), "os": {"release": "Rocky Linux 9.4 (Blue Onyx)"}})
    got = node.launchers([rhel])
    assert [g[4] for g in got] == [
        "on r: sudo dnf install -y pdsh pdsh-rcmd-ssh"
    ]  # no mpirun anywhere: not asked
    got = node.launchers([contact("a"), contact("b", facts={"programs": {"pdsh"}})])
    assert (
        sorted(g[4] for g in got if g[0] == "b")
        == ["on b: sudo apt-get install -y openmpi-bin"] * 2
    )


def test_disk_needs_depend_on_the_node():
    small = {
        "dir": "/h",
        "mount": "/h",
        "free": 800 * 2**20,
        "size": 2**34,
        "inodes_free": 9,
        "writable": True,
        "readonly": False,
    }
    assert node.disk([contact(facts={"room": small})])[0][1] == "DISK_LOW"
    assert node.disk([contact(facts={"room": small, "venv": {"exists": True}})])[0][1] == "DISK_OK"
    gpu = contact(facts={"room": dict(small, free=5 * 2**30), "gpus": {"count": 8}})
    assert node.disk([gpu])[0][1] == "DISK_LOW"
    assert node.disk([contact(facts={"room": dict(small, readonly=True)})])[0][1] == "DISK_READONLY"
    assert node.disk([contact(facts={"room": None})])[0][1] == "DISK_UNKNOWN"


# -- the command: crash isolation, selection, rendering -------------------------------------


def boom(_view):
    raise KeyError("surprise")


def test_a_crashing_check_is_a_finding_and_the_others_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    crashing = CheckSpec("crashy", "always crashes", codes={}, run=boom, tier="controller")
    monkeypatch.setattr(catalogue, "CHECKS", (crashing,) + catalogue.CHECKS)
    settings = Settings(
        project_root=str(tmp_path),
        state_dir=str(tmp_path / "st"),
        lab_root=str(tmp_path / "labs"),
        default_inventory="absent",
    )
    res = doctor_cmd.doctor(DoctorOptions(), settings, Events())
    crash = [f for f in res.findings if f.check == "crashy"]
    assert [(f.code, f.verdict) for f in crash] == [
        ("CHECK_CRASHED", Verdict.UNKNOWN)
    ] and "KeyError" in crash[0].reason
    assert {f.check for f in res.findings} >= {
        "ssh_keys",
        "ssh_agent",
        "ssh_config",
        "labs",
        "python_deps",
    }
    assert res.exit_code == 1 and "node checks skipped" in res.skipped
    text = doctor_text.render(res)
    assert "[?] crashy" in text and text.splitlines()[-1].startswith("doctor: 15 checks")


def test_check_selection_and_unknown_names():
    assert [c.name for c in catalogue.select(("disk", "reach"))] == ["disk", "reach"]
    with pytest.raises(InputError, match="no such check"):
        catalogue.select(("nope",))


def test_render_folds_nodes_with_the_same_finding():
    res = doctor_cmd.DoctorResult(("launchers",), [], ["n1", "n2", "n3"], inventory="lab")
    from nodeprep.ops.health.findings import Finding

    res.findings = [
        Finding(n, "launchers", "NOT_ON_PATH", Verdict.WARN, f"pdsh missing on {n}", f"on {n}: x")
        for n in ("n1", "n2")
    ] + [Finding("n3", "launchers", "PROGRAMS_OK", Verdict.OK, "ok", "")]
    text = doctor_text.render(res)
    assert "[!] launchers    1 of 3 OK (n3)" in text and "n[1-2]: pdsh missing on n1" in text
    assert text.count("NOT_ON_PATH") == 1 and "(for each of n[1-2])" in text
    assert "PROGRAMS_OK" not in text and "PROGRAMS_OK" in doctor_text.render(res, verbose=True)


# -- ssh.prune ------------------------------------------------------------------------------


def block(name: str, body: str = "Host a\n    HostName 192.0.2.1\n") -> str:
    return (
        f"# BEGIN nodeprep hosts {name} (managed: edits inside this block are replaced)\n{body}"
        f"# END nodeprep hosts {name}\n"
    )


def test_prune_removes_only_blocks_whose_inventory_is_gone(tmp_path):
    (tmp_path / "inventory" / "live").mkdir(parents=True)
    kept_path = tmp_path / "elsewhere.yml"
    kept_path.write_text("hosts: {}\n")
    mine = "# my own\r\nHost mybox  \n\tHostName 192.0.2.7\n\n"
    text = (
        mine
        + block("gone")
        + block("live")
        + block(str(tmp_path / "tmpinv" / "hosts.yml"))
        + block(str(kept_path))
        + "Host tail\n    User me\n"
    )
    cfg = tmp_path / "config"
    cfg.write_bytes(text.encode())
    os.chmod(cfg, 0o640)
    settings = Settings(project_root=str(tmp_path))
    dry = prune(PruneOptions(config=str(cfg), dry_run=True), settings)
    assert dry.removed == ["gone", str(tmp_path / "tmpinv" / "hosts.yml")] and not dry.written
    assert cfg.read_bytes() == text.encode()
    res = prune(PruneOptions(config=str(cfg)), settings)
    assert res.written and res.kept == ["live", str(kept_path)]
    assert (
        cfg.read_bytes().decode()
        == mine + block("live") + block(str(kept_path)) + "Host tail\n    User me\n"
    )
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o640
    assert prune(PruneOptions(config=str(cfg)), settings).removed == []  # again: nothing to do


def test_a_refused_inventory_is_a_finding_and_a_missing_one_a_bad_flag(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    inv = tmp_path / "hosts.ini"
    inv.write_text("[g]\nn1 ansible_host=192.0.2.1 ansible_ssh_pass=hunter2\n")
    settings = Settings(
        project_root=str(tmp_path), state_dir=str(tmp_path / "st"), lab_root=str(tmp_path / "labs")
    )
    res = doctor_cmd.doctor(DoctorOptions(inventory=str(inv)), settings, Events())
    bad = [f for f in res.problems() if f.check == "inventory"]
    assert [f.code for f in bad] == ["INVENTORY_REFUSED"] and f"{inv}:2" in bad[0].reason
    assert "ssh-copy-id" in bad[0].fix and "hunter2" not in bad[0].reason + bad[0].fix
    assert "node checks skipped" in res.skipped and not res.nodes
    with pytest.raises(InputError, match="not found"):
        doctor_cmd.doctor(DoctorOptions(inventory=str(tmp_path / "nope.ini")), settings, Events())


def test_a_jump_hosts_changed_key_or_refused_login_names_the_jump_host():
    key = contact(
        "n1",
        reached=False,
        error_kind="HostKeyChanged",
        inventory=" --inventory x",
        message="host key of the jump host ops@10.0.0.5:2222 (10.0.0.5:2222) CHANGED: "
        "pinned A, it offers B",
    )
    assert connection.host_key([key])[0][4].endswith("invoke hosts.forget 10.0.0.5 --inventory x")
    auth = contact(
        "n1",
        reached=False,
        error_kind="AuthFailed",
        message="authentication failed on the jump host ops@bastion: Authentication failed.",
    )
    assert connection.auth([auth])[0][4].startswith("ssh-copy-id -i /k/id.pub ops@bastion  (")
    auth.message = (
        "authentication failed on the jump host ops@10.0.0.5:2222: Authentication failed."
    )
    assert connection.auth([auth])[0][4].startswith(
        "ssh-copy-id -i /k/id.pub -p 2222 ops@10.0.0.5  ("
    )


def _recorded_modules(case: str) -> dict:
    """The MODULES fact as parsed from one of the lab recordings in tests/facts/modules/."""
    rec = json.loads((Path(__file__).parents[1] / "facts" / "modules" / f"{case}.json").read_text())
    return factmod.MODULES.parse(rec["output"], rec["rc"])


def test_modules_are_checked_only_where_named_and_a_missing_one_names_what_the_node_has():
    names = ["python/3.11", "cuda/12.6", "cuda/12.8"]
    missing = contact("a", facts={"modules": _recorded_modules("lmod_missing_version")})
    missing.vars["modules"] = names
    nosys = contact("b", facts={"modules": _recorded_modules("no_init")})
    nosys.vars["modules"] = names
    silent = contact("c", facts={"modules": None})
    silent.vars["modules"] = names
    plain = contact("d")  # names no modules: nothing to say
    got = node.modules([missing, nosys, silent, plain])
    assert [(g[0], g[1], g[2]) for g in got] == [
        ("a", "MODULE_NOT_LOADED", Verdict.CRITICAL),
        ("b", "MODULES_NO_SYSTEM", Verdict.CRITICAL),
        ("c", "MODULES_UNKNOWN", Verdict.UNKNOWN),
    ]
    assert got[0][3] == "module cuda/12.8 not available (cuda/12.4, cuda/12.6 are)", got[0]
    assert "module_init" in got[1][4]
    missing.vars["modules"] = names[:2]
    ok = node.modules([missing])
    assert ok[0][1:3] == ("MODULES_OK", Verdict.OK) and "cuda/12.6" in ok[0][3], ok
