"""verify's fan-out script, run for real by /bin/sh with a stand-in `ssh` that runs the remote
command locally (or fails like an unreachable peer): framing of every node's answer, the
login results, and what gather_fanout hands back. The real-sshd path is in
tests/integration/test_verify.py (fan-out on the lab)."""

from __future__ import annotations

import os
import stat
import subprocess
from types import SimpleNamespace

import pytest

from nodeprep.engine import facts
from nodeprep.engine.transports import fanout
from nodeprep.ops.ssh import logins as meshmod


def gather_fanout(session, hosts, requests, peers, timeout):
    """The head's fan-out, answers shaped {node: {"facts": ...}} as verify keeps them."""
    v = {"venv_path": "~/.nodeprep/venv", "env_file": "~/.nodeprep/env.sh", "ssh_mesh": False}
    got = fanout.probe_via_head(
        session,
        hosts,
        {h.name: requests for h in hosts},
        {h.name: v for h in hosts},
        peers,
        timeout,
    )
    return None if got is None else ({n: {"facts": f} for n, f in got[0].items()}, got[1])


FAKE_SSH = r"""#!/bin/sh
# stand-in for OpenSSH: skip `-o X` options, then HOST CMD...; "down" fails like ssh does
while [ "$1" = "-o" ]; do shift 2; done
[ "$1" = "--" ] && shift
host=$1; shift
case $host in
  down) echo "ssh: connect to host down port 22: No route to host" >&2; exit 255;;
  garbled) echo "not a probe"; exit 0;;
esac
export FAKE_NODE=$host
exec /bin/sh -c "$*"
"""


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "ssh").write_text(FAKE_SSH)
    (bin_ / "ssh").chmod(0o755 | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def run_sh(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=60)


def test_every_answer_framed_and_logins_reported(fake_ssh):
    probes = {
        "a": "echo hello from $FAKE_NODE\n",
        "b": "echo '@@forged:n0@@'; printf 'no newline'\n",
        "down": "echo never\n",
    }
    script = fanout.fanout_script(["a", "b", "down", "c"], probes, 30, "tok")
    assert script.count('cat > "$_npf/p') == 3  # one file per distinct probe
    r = run_sh(script)
    assert r.returncode == 0, r.stderr
    sec = facts.split_sections(r.stdout, "tok")
    assert sec["n0"] == ("hello from a\n", 0)
    assert sec["n1"] == ("@@forged:n0@@\nno newline", 0)  # another token is plain text
    assert sec["n2"] == ("", 255) and "No route to host" in sec["e2"][0]
    assert sec["n3"] == ("", 0)  # a peer without a probe: `true`
    assert not list(fake_ssh.glob("nodeprep-fan.*"))  # its temp dir is gone


def test_answers_do_not_outlive_a_killed_run(fake_ssh):
    """The answers carry env files: their temp dir goes on TERM (a timeout) too."""
    import signal
    import time

    script = fanout.fanout_script(["a"], {"a": "echo secret; sleep 30\n"}, 60, "tok")
    p = subprocess.Popen(
        ["/bin/sh", "-c", script], stdout=subprocess.DEVNULL, start_new_session=True
    )
    for _ in range(100):
        if list(fake_ssh.glob("nodeprep-fan.*/o0")):
            break
        time.sleep(0.05)
    assert list(fake_ssh.glob("nodeprep-fan.*"))
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=10)
    os.killpg(p.pid, signal.SIGKILL)  # the stand-in probe's sleep, left in its group
    assert not list(fake_ssh.glob("nodeprep-fan.*"))


def test_identical_probes_are_written_once(fake_ssh):
    script = fanout.fanout_script(["a", "b"], {"a": "echo x\n", "b": "echo x\n"}, 30, "tok")
    assert script.count('cat > "$_npf/p') == 1
    sec = facts.split_sections(run_sh(script).stdout, "tok")
    assert sec["n0"][0] == sec["n1"][0] == "x\n"


class LocalSession:
    """Session.run for the head, done by the local /bin/sh (with the fake ssh on PATH)."""

    name = "a"

    def log(self, text):
        pass

    def run(self, script, timeout=None, label=None, log_output=True):
        r = run_sh(script)
        return SimpleNamespace(stdout=r.stdout, rc=r.returncode, tail=lambda n=3: r.stderr)


def test_gather_fanout_parses_reached_nodes_and_leaves_the_rest(fake_ssh, monkeypatch):
    hosts = [SimpleNamespace(name=n, address=None) for n in ("a", "b", "down", "garbled")]
    reqs = [facts.USER, facts.PYTHON_ON_PATH]
    got, mesh = gather_fanout(LocalSession(), hosts, reqs, ["a", "b", "down", "garbled"], 30)
    assert sorted(got) == ["a", "b"]  # garbled and down: probed directly later
    assert got["b"]["facts"]["user"]["uid"] == os.getuid()
    assert mesh["a"] == (0, "") and mesh["garbled"] == (0, "")  # logged in, answer unusable
    assert mesh["down"][0] == 255 and "No route to host" in mesh["down"][1]


def test_fans_out_only_where_the_head_alone_logs_in():
    names = ["w0", "w1", "w2", "w3", "w4"]
    assert meshmod.fans_out(meshmod.mesh_pairs(names, "auto"), "w0", "auto")  # 5 > 4: head
    assert meshmod.fans_out(meshmod.mesh_pairs(names[:3], "head"), "w0", "auto")
    assert not meshmod.fans_out(meshmod.mesh_pairs(names[:3], "auto"), "w0", "auto")  # full mesh
    assert not meshmod.fans_out(meshmod.mesh_pairs(names, "head"), "w0", "direct")
    assert not meshmod.fans_out(meshmod.mesh_pairs(names, "head"), "w1", "auto")  # --limit !w0


def test_an_answer_from_a_machine_without_the_inventory_address_is_refused(fake_ssh, monkeypatch):
    """The head dials the NAME: an answer counts only if the machine that gave it has the
    inventory's address (here this machine: 127.0.0.1 yes, 192.0.2.7 no)."""
    hosts = [
        SimpleNamespace(name="a", address="127.0.0.1"),
        SimpleNamespace(name="b", address="192.0.2.7"),
    ]
    reqs = [facts.USER, facts.INTERFACES]
    got, mesh = gather_fanout(LocalSession(), hosts, reqs, ["a", "b"], 30)
    assert list(got) == ["a"] and mesh["a"] == (0, "")
    assert mesh["b"][0] == 1 and "without b's address 192.0.2.7" in mesh["b"][1]


def test_a_refusing_login_shell_fails_the_pair(fake_ssh, monkeypatch):
    """Exit 1 before the probe starts (a nologin shell): the login does not count, as it
    would not for pdsh; only 0 from `true` or a started probe do."""
    (fake_ssh / "bin" / "ssh").write_text(
        FAKE_SSH.replace(
            "  garbled)",
            "  nologin) echo 'This account is currently not available.'; exit 1;;\n  garbled)",
        )
    )
    hosts = [SimpleNamespace(name="nologin", address=None)]
    reqs = [facts.USER]
    got, mesh = gather_fanout(LocalSession(), hosts, reqs, ["nologin", "other"], 30)
    assert got == {} and mesh["nologin"][0] == 1 and mesh["other"] == (0, "")


def test_a_failed_fan_out_says_so(fake_ssh, monkeypatch):
    """No temp dir on the head (or a killed run): None, and the caller goes direct."""
    monkeypatch.setenv("TMPDIR", str(fake_ssh / "does-not-exist"))
    hosts = [SimpleNamespace(name="a", address=None)]
    reqs = [facts.USER]
    assert gather_fanout(LocalSession(), hosts, reqs, ["a"], 30) is None


def test_a_big_fleet_fits_one_command_and_every_peer_answers(fake_ssh):
    """The script grows by a list line per peer (~20 bytes), not by a command line each: 2,000
    peers fit in one command; 300 of them run for real, PARALLEL at a time."""
    big = fanout.fanout_script(
        [f"node{i:04d}" for i in range(2000)],
        {f"node{i:04d}": "echo hi\n" for i in range(2000)},
        30,
        "tok",
    )
    assert len(big) * 4 // 3 < fanout.FANOUT_MAX
    peers = [f"node{i:03d}" for i in range(300)]
    r = run_sh(fanout.fanout_script(peers, {p: "echo from $FAKE_NODE\n" for p in peers}, 30, "tok"))
    sec = facts.split_sections(r.stdout, "tok")
    assert all(sec[f"n{i}"] == (f"from {p}\n", 0) for i, p in enumerate(peers))


def test_mesh_logins_script_reports_every_peer(fake_ssh):
    """ops/ssh/logins' head-side logins (the direct verify path and the train preflight), for real
    with the stand-in ssh: an exit status per peer, the error line of a failed one; 400 peers
    in a command of a few KB; a name that is not a plain word never reaches the script."""
    r = run_sh(meshmod.mesh_script(["a", "down", "b"]))
    assert meshmod.parse_mesh(r.stdout) == {
        "a": (0, ""),
        "b": (0, ""),
        "down": (255, "ssh: connect to host down port 22: No route to host"),
    }
    assert len(meshmod.mesh_script([f"node{i:03d}" for i in range(400)])) < 20_000
    with pytest.raises(ValueError):
        meshmod.mesh_start(["a b"])
