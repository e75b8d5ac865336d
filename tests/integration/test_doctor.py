"""`invoke doctor` on the lab: each fault is made behind nodeprep's back, doctor names it on
the right node (or the controller) with its fix, the fix is carried out as a user would (the
command doctor printed, run where it says), and doctor then finds nothing (exit 0).

Faults: a stale block and a conflicting alias in the controller's ssh config, a changed host
key, a stopped node, a node whose user may not sudo while the shell role must change the
login shell, pdsh only on a login shell's PATH, a full ~/.nodeprep."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import DoctorOptions, ForgetOptions, PruneOptions
from nodeprep.lab import net as labnet
from nodeprep.lab.config import SUDOERS_NAME


@pytest.fixture
def doc(lab, lab_settings, tmp_path, capsys):
    cfg = tmp_path / "ssh_config"
    cfg.write_text("")
    sets = (f"controller_ssh_config={cfg}",)

    def run(*more: str) -> tuple[int, list[dict]]:
        capsys.readouterr()  # what an earlier command printed
        code = api.doctor(
            DoctorOptions(inventory=str(lab.inventory), json=True, sets=sets + more), lab_settings
        )
        rep = json.loads(capsys.readouterr().out)
        return code, [
            f for c in rep["checks"].values() for f in c["findings"] if f["verdict"] != "OK"
        ]

    code, bad = run()
    assert code == 0, said(bad)  # the lab as it is: nothing to say
    return run, cfg


def said(findings) -> str:
    """The findings in full (pytest elides long dicts in an assertion's message) and, for a
    lab leftover, every namespace on this machine with what runs in it."""
    text = "\n".join(
        f"{f['verdict']} {f['code']} on {f['node']}: {f['reason']} -> {f['fix']}" for f in findings
    )
    if any(f["code"] == "LAB_LEFTOVER" for f in findings):
        for ns, pids in labnet.netns_pids(labnet.netns_list()).items():
            text += f"\nnetns {ns}: " + "; ".join(_cmdline(p) for p in pids)
    return text


def _cmdline(pid: int) -> str:
    try:
        return (
            f"{pid} "
            + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        )
    except OSError:
        return f"{pid} (gone)"


def found(findings, code: str, node: str) -> dict:
    mine = [f for f in findings if f["code"] == code and f["node"] == node]
    assert mine, findings
    return mine[0]


def on_node(fix: str, node: str) -> str:
    """The command of a fix `on NODE: COMMAND  (note)`."""
    assert fix.startswith(f"on {node}: "), fix
    return fix[len(f"on {node}: ") :].split("  (")[0]


def test_a_stale_block_is_found_and_ssh_prune_removes_it(doc, lab_settings):
    run, cfg = doc
    mine = "Host mine\n    HostName 192.0.2.9\n"
    cfg.write_text(
        mine + "# BEGIN nodeprep hosts gone-inv (managed: edits inside this block are replaced)\n"
        "Host old-1\n    HostName 192.0.2.1\n# END nodeprep hosts gone-inv\n"
    )
    code, bad = run()
    assert code == 1 and found(bad, "BLOCK_STALE", "controller")["fix"] == "invoke ssh.prune"
    assert api.ssh_prune(PruneOptions(config=str(cfg)), lab_settings) == 0
    assert cfg.read_text() == mine and run()[0] == 0


def test_a_conflicting_alias_is_found_and_removing_the_entry_clears_it(doc, lab):
    run, cfg = doc
    entry = f"Host t-{lab.nodes[0].name}\n    HostName 192.0.2.50\n"
    cfg.write_text("Host keep\n    User me\n" + entry)
    code, bad = run()
    f = found(bad, "ALIAS_CONFLICT", "controller")
    assert code == 1 and f"{cfg}:3" in f["fix"] and "(now 't-')" in f["fix"], f
    other = re.search(r"ssh_alias_prefix: (\S+)`", f["fix"]).group(1)
    assert other != "t-" and run(f"ssh_alias_prefix={other}")[0] == 0  # the fix's second form
    cfg.write_text("Host keep\n    User me\n")  # its first form
    assert run()[0] == 0


def test_a_changed_host_key_is_found_and_hosts_forget_clears_it(doc, lab, lab_settings):
    run, _cfg = doc
    labmod.regenerate_host_key(lab, 2)
    code, bad = run()
    fix = found(bad, "HOST_KEY_CHANGED", "worker-2")["fix"]
    assert code == 1 and f"invoke hosts.forget worker-2 --inventory {lab.inventory}" in fix
    assert (
        api.hosts_forget(
            ForgetOptions(nodes="worker-2", inventory=str(lab.inventory)), lab_settings
        )
        == 0
    )
    assert run()[0] == 0  # re-pinned at this contact


def test_a_stopped_node_is_found_and_starting_it_clears_it(doc, lab, lab_up):
    run, _cfg = doc
    labmod.stop_node(lab, 1)
    try:
        code, bad = run()
        assert (
            code == 1
            and "connection refused" in found(bad, "NODE_UNREACHABLE", "worker-1")["reason"]
        )
        assert "--limit '!worker-1'" in found(bad, "NODE_UNREACHABLE", "worker-1")["fix"]
        assert found(bad, "LAB_LEFTOVER", "controller")["fix"].startswith("invoke lab.up --name t")
        assert {f["code"] for f in bad if f["node"] == "worker-1"} == {
            "NODE_UNREACHABLE",
            "NOT_CHECKED",
        }
    finally:
        lab_up()
    assert run()[0] == 0


def test_no_sudo_where_the_shell_must_change_is_found_and_the_admins_usermod_clears_it(
    doc, lab, lab_restore
):
    run, _cfg = doc
    rule = lab.nodes[1].home.parent / "etc" / "sudoers.d" / SUDOERS_NAME
    aside = rule.with_name(SUDOERS_NAME + ".aside")  # sudo's #includedir skips names with a dot
    rule.rename(aside)
    try:
        code, bad = run("login_shell=/bin/zsh")
        f = found(bad, "SUDO_MISSING", "worker-1")
        assert code == 1 and [x["node"] for x in bad] == ["worker-1"], (
            bad
        )  # the others may sudo usermod
        assert f["fix"].startswith("as root on worker-1: usermod -s /bin/zsh nodeprep"), f
        r = labmod.node_shell(lab, 1, f["fix"].split(": ", 1)[1].split("  (")[0])
        assert r.returncode == 0, r.stderr
        assert run("login_shell=/bin/zsh")[0] == 0
    finally:
        aside.rename(rule)


def test_pdsh_only_on_a_login_shells_path_is_found_and_the_path_fix_clears_it(doc, lab, lab_ssh):
    run, _cfg = doc
    home = lab.nodes[2].home
    saved = {
        n: (home / n).read_bytes() if (home / n).exists() else None for n in (".bashrc", ".profile")
    }
    opt = home / "optbin"
    opt.mkdir()
    shutil.copy2("/usr/bin/pdsh", opt / "pdsh")
    with (home / ".profile").open("a") as fh:
        fh.write('export PATH="$HOME/optbin:$PATH"\n')
    owner = home.stat()
    subprocess.run(
        ["chown", "-R", f"{owner.st_uid}:{owner.st_gid}", str(opt), str(home / ".profile")],
        check=True,
    )
    hide = labmod.node_shell(
        lab, 2, "touch /tmp/np-no-pdsh && mount --bind /tmp/np-no-pdsh /usr/bin/pdsh"
    )
    assert hide.returncode == 0, hide.stderr
    try:
        code, bad = run()
        f = found(bad, "NOT_ON_PATH", "worker-2")
        assert (
            code == 1 and "a login shell finds it at /home/nodeprep/optbin/pdsh" in f["reason"]
        ), f
        r = lab_ssh(2, on_node(f["fix"], "worker-2"))
        assert r.returncode == 0, r.stderr
        assert run()[0] == 0
    finally:
        labmod.node_shell(lab, 2, "umount /usr/bin/pdsh; rm -f /tmp/np-no-pdsh")
        shutil.rmtree(opt)
        for n, data in saved.items():
            (home / n).unlink(missing_ok=True) if data is None else (home / n).write_bytes(data)


def test_a_full_disk_is_found_and_freeing_it_clears_it(doc, lab):
    run, _cfg = doc
    labmod.limit_space(lab, 0, size="16m")
    try:
        code, bad = run()
        f = found(bad, "DISK_LOW", "worker-0")
        assert (
            code == 1 and "16 MiB free" in f["reason"] and "on worker-0: free space" in f["fix"]
        ), f
    finally:
        labmod.limit_space(lab, 0, size=None)  # what freeing the space does
    assert run()[0] == 0


def test_empty_namespaces_of_no_lab_are_found_and_a_running_one_is_left_alone(doc):
    """np-zz-0 holds nothing and no lab directory names it: a leftover, its fix deletes it.
    np-zy-0 holds a process (a lab run from another lab root looks so): never reported, its
    namespace never offered for deletion."""
    run, _cfg = doc
    subprocess.run(["ip", "netns", "add", "np-zz-0"], check=True)
    subprocess.run(["ip", "netns", "add", "np-zy-0"], check=True)
    live = subprocess.Popen(["ip", "netns", "exec", "np-zy-0", "sleep", "600"])
    try:
        for _ in range(500):  # until the process has entered the namespace
            if labnet.netns_pids(["np-zy-0"])["np-zy-0"]:
                break
            time.sleep(0.01)
        code, bad = run()
        f = found(bad, "LAB_LEFTOVER", "controller")
        assert code == 1 and f["fix"] == "ip netns del np-zz-0" and "lab zz:" in f["reason"], said(
            bad
        )
        assert not any("zy" in b["reason"] or "zy" in b["fix"] for b in bad), said(bad)
        subprocess.run(f["fix"], shell=True, check=True)  # the fix, as printed
        assert run()[0] == 0
    finally:
        live.kill()
        live.wait()
        for ns in ("np-zz-0", "np-zy-0"):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_doctor_text_and_exit_code_on_the_lab(lab, lab_settings, tmp_path, capsys):
    cfg = tmp_path / "c"
    assert (
        api.doctor(
            DoctorOptions(inventory=str(lab.inventory), sets=(f"controller_ssh_config={cfg}",)),
            lab_settings,
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "[✓] reach        3 of 3 OK" in out and out.rstrip().endswith("no issue found"), out
    assert Path(cfg).exists() is False  # doctor writes nothing on the controller
