"""`provision` against the lab through real sshd: from scratch, idempotent, the ssh mesh with
host keys pinned, --check/--diff, drift restored, user content kept, secrets never shown."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import ProvisionOptions

ROLES = "ssh_keys,ssh_config,shell,nccl,deepspeed_env"


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    d = tmp_path_factory.mktemp("controller")
    cfg = d / "ssh_config"
    cfg.write_text("# my own settings\nHost gateway\n    HostName 192.0.2.1\n")
    return {"key": d / "id_ed25519", "config": cfg}


@pytest.fixture(scope="module")
def prov(lab, lab_settings, controller):
    def run(*sets, check=False, diff=False, limit=None, roles=ROLES, capsys=None):
        base = [
            f"controller_key={controller['key']}",
            f"controller_ssh_config={controller['config']}",
        ]
        code = api.provision(
            ProvisionOptions(
                inventory=str(lab.inventory),
                limit=limit,
                roles=roles,
                check_mode=check,
                diff=diff,
                json=True,
                sets=tuple(base + list(sets)),
            ),
            lab_settings,
        )
        out = capsys.readouterr() if capsys else None
        rep = json.loads(out.out[out.out.index("{\n") :]) if out and code != 2 else None
        return code, rep, (out.err if out else "")

    return run


def home(lab, i) -> Path:
    return Path(lab.nodes[i].home)


def _run_logs(rep) -> str:
    """Every file of the run's directory, read as one text (to look for what must not be
    there); the node logs must be among them, or a secret "not in" it would prove nothing."""
    files = [p for p in Path(rep["run_dir"]).rglob("*") if p.is_file()]
    assert any(p.suffix == ".log" and p.stat().st_size for p in files), files
    return "".join(p.read_text() for p in files)


def test_from_scratch_then_nothing_changes(prov, lab, capsys):
    code, rep, _ = prov(capsys=capsys)
    assert code == 0, rep
    assert rep["failed"] == rep["unreachable"] == 0
    assert all(r["changed"] > 0 for r in rep["nodes"].values())
    code, rep, _ = prov(capsys=capsys)
    assert code == 0
    assert rep["changed"] == 0
    assert {n: (r["status"], r["changed"]) for n, r in rep["nodes"].items()} == {
        n.name: ("ok", 0) for n in lab.nodes
    }


def test_every_ordered_pair_reaches_each_other_with_checking_on(prov, lab, lab_ssh, capsys):
    assert prov(capsys=capsys)[0] == 0
    for a in lab.nodes:
        for b in lab.nodes:
            r = lab_ssh(a, f"ssh -o BatchMode=yes -o StrictHostKeyChecking=yes {b.name} hostname")
            assert (r.returncode, r.stdout.strip()) == (0, b.name), (a.name, b.name, r.stderr)
    cfg = (home(lab, 0) / ".ssh" / "config").read_text()
    assert "StrictHostKeyChecking no" not in cfg and "/dev/null" not in cfg


def test_files_are_private_and_no_temp_files_left(prov, lab, capsys):
    assert prov(capsys=capsys)[0] == 0
    ssh = home(lab, 1) / ".ssh"
    for name in ("authorized_keys", "config", "nodeprep_cluster_ed25519"):
        assert (ssh / name).stat().st_mode & 0o777 == 0o600, name
    assert (home(lab, 1) / ".deepspeed_env").stat().st_mode & 0o777 == 0o600
    leftovers = [p for p in home(lab, 1).rglob(".nodeprep.*")]
    assert leftovers == []


def test_check_names_the_drifted_node_and_file_then_run_restores(prov, lab, capsys):
    assert prov(capsys=capsys)[0] == 0
    env = home(lab, 1) / ".deepspeed_env"
    good = env.read_text()
    env.write_text(good + "EXTRA=1\n")
    code, rep, _ = prov(check=True, capsys=capsys)
    assert code == 0
    drifted = {
        n: [s["step"] for s in r["steps"] if s["status"] == "changed"]
        for n, r in rep["nodes"].items()
        if r["changed"]
    }
    assert drifted == {"worker-1": ["deepspeed_env: file.content ~/.deepspeed_env"]}
    assert env.read_text() == good + "EXTRA=1\n"  # --check touched nothing
    code, rep, _ = prov(capsys=capsys)
    assert code == 0 and rep["changed"] == 1
    assert env.read_text() == good


def test_live_progress_names_the_step_each_node_is_in(prov, lab, capsys, monkeypatch):
    """The live display's row for a node says which step of its batched apply it is in (the
    markers of the apply script, read as they stream back), not just "apply"."""
    import sys

    from nodeprep.cli import display as report

    seen = []

    class Recorder(report.Display):
        def status(self, node, stage, status, message=""):
            seen.append((node, stage, status, message))

    monkeypatch.setattr(report.Display, "auto", staticmethod(lambda **kw: Recorder(sys.stderr)))
    assert prov(capsys=capsys)[0] == 0
    env = home(lab, 2) / ".deepspeed_env"
    good = env.read_text()
    env.write_text(good + "EXTRA=1\n")
    seen.clear()
    code, rep, _ = prov(capsys=capsys)
    assert code == 0 and rep["changed"] == 1 and env.read_text() == good
    running = [
        (n, m)
        for n, stage, st, m in seen
        if stage == "apply" and st == "running" and m.startswith("step ")
    ]
    assert ("worker-2", "step 1/1: deepspeed_env: file.content ~/.deepspeed_env") in running
    assert not [n for n, _m in running if n != "worker-2"]


def test_user_lines_outside_the_block_survive(prov, lab, controller, capsys):
    assert prov(capsys=capsys)[0] == 0
    cfg = home(lab, 0) / ".ssh" / "config"
    text = cfg.read_text()
    mine_top, mine_bottom = "# top line by the user\n", "Host mybox\n    HostName 192.0.2.7\n"
    broken = text.replace("    IdentitiesOnly yes\n", "", 1)  # someone edited inside the block
    cfg.write_text(mine_top + broken + mine_bottom)
    code, rep, _ = prov(capsys=capsys)
    assert code == 0 and rep["nodes"]["worker-0"]["changed"] == 1
    assert cfg.read_text() == mine_top + text + mine_bottom
    ctl = controller["config"].read_text()
    # the user's lines byte for byte, after nodeprep's block: ssh takes the first value it finds
    assert ctl.endswith("# my own settings\nHost gateway\n    HostName 192.0.2.1\n")
    assert ctl.startswith("# BEGIN nodeprep hosts ")
    assert all(f"Host t-{n.name}\n" in ctl for n in lab.nodes)  # a named lab: its alias prefix


def test_diff_and_reports_never_show_secrets(prov, lab, lab_settings, capsys):
    secret = "hf_superSecretValue123"
    code, rep, err = prov(
        "deepspeed_env={HF_TOKEN: %s, HF_HOME: /scratch/hf}" % secret,
        check=True,
        diff=True,
        capsys=capsys,
    )
    assert code == 0
    assert "<redacted>" in err and "HF_HOME=/scratch/hf" in err
    code, rep, err = prov(
        "deepspeed_env={HF_TOKEN: %s, HF_HOME: /scratch/hf}" % secret, diff=True, capsys=capsys
    )
    assert code == 0 and rep["changed"] == len(lab.nodes)
    assert f"HF_TOKEN={secret}\n" in (home(lab, 2) / ".deepspeed_env").read_text()
    shown = err + json.dumps(rep)
    logs = _run_logs(rep)
    assert secret not in shown and secret not in logs
    assert prov(capsys=capsys)[0] == 0  # back to the inventory's state


@pytest.mark.parametrize(
    "value,message",
    [
        ("{BAD-KEY: 1}", "is not a shell identifier"),
        ('{GOOD: "two\\nlines"}', "values are single-line text"),  # inventory.fields, at load
    ],
)
def test_bad_deepspeed_env_refused_before_touching_nodes(prov, lab, capsys, value, message):
    env = home(lab, 0) / ".deepspeed_env"
    before = env.stat().st_mtime_ns if env.exists() else None
    code, _rep, err = prov(f"deepspeed_env={value}", capsys=capsys)
    assert code == 2
    assert message in err and err.count("\n") == 1
    assert (env.stat().st_mtime_ns if env.exists() else None) == before


def test_regenerated_host_key_refused_others_complete(prov, lab, lab_up, capsys):
    assert prov(capsys=capsys)[0] == 0
    labmod.regenerate_host_key(lab, 2)
    try:
        code, rep, _ = prov(capsys=capsys)
    finally:
        lab_up()  # the lab made the key, so it re-pins it
    assert code == 1
    assert rep["nodes"]["worker-2"]["status"] == "failed"
    assert "CHANGED" in rep["nodes"]["worker-2"]["message"]
    assert [rep["nodes"][n]["status"] for n in ("worker-0", "worker-1")] == ["ok", "ok"]
    # With the new key pinned, the next run spreads it to every node's known_hosts.
    code, rep, _ = prov(capsys=capsys)
    assert code == 0 and all(r["changed"] == 1 for r in rep["nodes"].values())


def _shell_of(lab, i) -> str:
    passwd = (Path(lab.nodes[i].home).parent / "etc" / "passwd").read_text()
    return next(ln.split(":")[-1] for ln in passwd.splitlines() if ln.startswith(lab.user + ":"))


def test_tcsh_node_gets_bash_and_env_reaches_noninteractive_shells(
    prov, lab, lab_ssh, lab_restore, capsys
):
    import subprocess

    node_dir = Path(lab.nodes[1].home).parent
    subprocess.run(
        ["usermod", "--prefix", str(node_dir), "--shell", "/bin/tcsh", lab.user], check=True
    )
    # Every command nodeprep sends must work while the login shell is still tcsh.
    code, rep, _ = prov("nccl_env={NCCL_DEBUG: INFO}", capsys=capsys)
    assert code == 0, rep
    changed = [s["step"] for s in rep["nodes"]["worker-1"]["steps"] if s["status"] == "changed"]
    assert "shell: user.shell /bin/bash" in changed
    assert [_shell_of(lab, i) for i in range(3)] == ["/bin/bash"] * 3
    for node in lab.nodes:  # a non-interactive ssh shell (what pdsh/mpirun start) sees the env
        r = lab_ssh(node, "echo NCCL_DEBUG=$NCCL_DEBUG")
        assert r.stdout.strip() == "NCCL_DEBUG=INFO", r.stderr
    code, rep, _ = prov("nccl_env={NCCL_DEBUG: INFO}", capsys=capsys)
    assert code == 0 and rep["changed"] == 0


def test_zsh_gets_zshenv(prov, lab, lab_ssh, lab_restore, capsys):
    code, rep, _ = prov(
        "login_shell=/usr/bin/zsh", "nccl_env={NCCL_DEBUG: WARN}", limit="worker-0", capsys=capsys
    )
    assert code == 0, rep
    assert _shell_of(lab, 0) == "/usr/bin/zsh" and _shell_of(lab, 1) == "/bin/bash"
    assert "nodeprep env" in (Path(lab.nodes[0].home) / ".zshenv").read_text()
    r = lab_ssh(0, "echo $0 NCCL_DEBUG=$NCCL_DEBUG")
    assert r.stdout.split()[-1] == "NCCL_DEBUG=WARN" and "zsh" in r.stdout


def test_shell_change_without_root_or_sudo_fails_with_fallback(prov, lab, lab_restore, capsys):
    node_dir = Path(lab.nodes[2].home).parent
    sudoers = node_dir / "etc" / "sudoers.d" / "nodeprep-lab"
    saved = sudoers.read_bytes()
    sudoers.unlink()
    try:
        code, rep, _ = prov("login_shell=/usr/bin/zsh", roles="shell", capsys=capsys)
    finally:
        sudoers.write_bytes(saved)
        sudoers.chmod(0o440)
    assert code == 1
    bad = rep["nodes"]["worker-2"]
    assert bad["status"] == "failed"
    step = next(s for s in bad["steps"] if s["status"] == "failed")
    assert "chsh -s /usr/bin/zsh nodeprep" in step["message"] and "~/.login" in step["message"]
    assert "no passwordless sudo" in bad["stderr_tail"]
    assert rep["nodes"]["worker-0"]["status"] == "changed" and _shell_of(lab, 2) == "/bin/bash"
    # the failed node's run lock is released too (the next run must not wait for it)
    assert not (Path(lab.nodes[2].home) / ".nodeprep" / "lock").exists()


def test_shell_not_in_etc_shells_is_refused(prov, lab, capsys):
    code, rep, _ = prov("login_shell=/usr/bin/ksh93", roles="shell", capsys=capsys)
    assert code == 1
    msgs = [
        s["message"] for r in rep["nodes"].values() for s in r["steps"] if s["status"] == "failed"
    ]
    assert len(msgs) == 3 and all("/usr/bin/ksh93 is not in /etc/shells" in m for m in msgs)


def test_ask_pass_installs_the_key_on_a_node_that_has_none(
    prov, lab, lab_settings, lab_restore, monkeypatch, capsys
):
    import io

    password = "lab-Pa55word-only"
    labmod.remove_authorized_key(lab, 1)
    labmod.enable_password(lab, 1, password)
    # Without a password the node cannot be reached at all.
    code, rep, _ = prov(f"controller_key={lab.key}", roles="ssh_keys", capsys=capsys)
    assert code == 1 and rep["nodes"]["worker-1"]["status"] == "unreachable"
    monkeypatch.setattr("sys.stdin", io.StringIO(password + "\n"))
    code = api.provision(
        ProvisionOptions(
            inventory=str(lab.inventory),
            limit=None,
            roles="ssh_keys",
            check_mode=False,
            diff=False,
            json=True,
            sets=(f"controller_key={lab.key}",),
        ),
        lab_settings,
        ask_pass=True,
    )
    out = capsys.readouterr()
    rep = json.loads(out.out)
    assert code == 0 and rep["nodes"]["worker-1"]["status"] == "changed"
    logs = _run_logs(rep)
    assert password not in out.out + out.err + logs
    labmod.disable_password(lab, 1)
    code, rep, _ = prov(f"controller_key={lab.key}", roles="ssh_keys", capsys=capsys)
    assert code == 0 and rep["nodes"]["worker-1"]["status"] == "ok"  # the key works now
    # Another controller key rewrites the block, but the key nodeprep logs in with stays.
    code, rep, _ = prov(roles="ssh_keys", capsys=capsys)
    assert code == 0 and rep["nodes"]["worker-1"]["status"] == "changed"
    code, rep, _ = prov(roles="ssh_keys", capsys=capsys)
    assert code == 0 and rep["nodes"]["worker-1"]["status"] == "ok"


def test_nccl_libraries_checked_per_node(prov, lab, lab_ssh, capsys):
    # /home/nodeprep is the same path on every node with different contents: node 2 lacks it.
    for i in (0, 1):
        lib = Path(lab.nodes[i].home) / "nccl" / "lib"
        lib.mkdir(parents=True, exist_ok=True)
        (lib / "libnccl.so.2").write_bytes(b"")
    code, rep, _ = prov(
        "nccl_home=/home/nodeprep/nccl", roles="shell,nccl,deepspeed_env", capsys=capsys
    )
    assert code == 1
    assert [rep["nodes"][n]["status"] for n in ("worker-0", "worker-1")] == ["changed", "changed"]
    bad = rep["nodes"]["worker-2"]
    failed = [s for s in bad["steps"] if s["status"] == "failed"]
    assert bad["status"] == "failed" and len(failed) == 1
    assert "/home/nodeprep/nccl/lib does not exist on this node" in failed[0]["message"]
    assert "fix nccl_home" in failed[0]["message"]
    assert "/home/nodeprep/nccl/lib" in (Path(lab.nodes[0].home) / ".deepspeed_env").read_text()
    r = lab_ssh(0, "echo $LD_LIBRARY_PATH")
    assert r.stdout.strip().split(":")[0] == "/home/nodeprep/nccl/lib"
    code, _rep, err = prov("nccl_home=~/nccl", roles="nccl", capsys=capsys)
    assert code == 2 and "is not an absolute path" in err
    assert prov(capsys=capsys)[0] == 0


def test_a_run_with_nothing_to_change_takes_no_lock(prov, lab, lab_settings, controller, capsys):
    """A no-op costs its probe alone: it neither waits for nor takes the run locks, even while
    another live run holds one; a run that must change something still waits and names it."""
    assert prov(capsys=capsys)[0] == 0
    lock = home(lab, 0) / ".nodeprep" / "lock"
    lock.mkdir(parents=True)
    (lock / "owner").write_text(
        f"{socket.gethostname()} {os.getpid()} {time.time():.0f} other-run\n"
    )
    try:
        t0 = time.monotonic()
        code, rep, err = prov(capsys=capsys)
        assert code == 0 and rep["changed"] == 0, rep
        assert "waiting up to" not in err and time.monotonic() - t0 < 60
        assert (lock / "owner").read_text().split()[3] == "other-run"  # left alone
        (home(lab, 0) / ".deepspeed_env").unlink()  # now one must change
        base = [
            f"controller_key={controller['key']}",
            f"controller_ssh_config={controller['config']}",
        ]
        code = api.provision(
            ProvisionOptions(
                inventory=str(lab.inventory), limit=None, roles=ROLES, json=True, sets=tuple(base)
            ),
            dataclasses.replace(lab_settings, lock_wait=2),
        )
        err = capsys.readouterr().err
        assert code != 0 and "waiting up to" in err and "locked by another nodeprep run" in err, err
    finally:
        (lock / "owner").unlink()
        lock.rmdir()
    code, rep, _ = prov(capsys=capsys)
    assert code == 0 and rep["changed"] >= 1, rep  # the lock gone: the drift is restored
