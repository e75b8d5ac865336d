"""The engine against the lab through real sshd: facts, partial failure, host-key pinning,
bounded fan-out, timeouts, prefixed output, one connection per node per run."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import paramiko

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.cli.display import Display
from nodeprep.commands.options import FactsOptions
from nodeprep.engine import facts
from nodeprep.engine.fleet import Fleet
from nodeprep.inventory import model as inventory

ROOT = Path(__file__).resolve().parents[2]


def run_facts(lab, settings, capsys, limit=None):
    code = api.facts(FactsOptions(inventory=str(lab.inventory), limit=limit, json=True), settings)
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


def test_facts_on_every_node(lab, lab_settings, capsys):
    code, rep, _ = run_facts(lab, lab_settings, capsys)
    assert code == 0
    assert (rep["failed"], rep["unreachable"], rep["changed"]) == (0, 0, 0)
    nodes = rep["nodes"]
    assert sorted(nodes) == [n.name for n in lab.nodes]
    assert {n: v["facts"]["hostname"] for n, v in nodes.items()} == {
        n.name: n.name for n in lab.nodes
    }
    ips = {n: v["facts"]["interfaces"]["eth0"][0] for n, v in nodes.items()}
    assert ips == {n.name: n.address for n in lab.nodes}
    for v in nodes.values():
        assert v["status"] == "ok"
        assert v["facts"]["python"]["path"].startswith("/usr/bin/python3")
        assert v["facts"]["gpus"]["present"] is False
        assert v["facts"]["os"]["arch"] == v["facts"]["os"]["arch"].strip() != ""
        assert v["facts"]["disk_free"] > 0
    run_dir = Path(rep["run_dir"])
    assert json.loads((run_dir / "report.json").read_text())["nodes"].keys() == nodes.keys()
    assert "probe hostname" in (run_dir / "worker-0" / "facts.log").read_text()


def test_text_table_and_limit(lab, lab_settings, capsys):
    assert (
        api.facts(FactsOptions(inventory=str(lab.inventory), limit="worker-[1-2]"), lab_settings)
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["node", "hostname", "ip"]
    assert [line.split()[0] for line in out[1:]] == ["worker-1", "worker-2"]


def test_down_node_is_unreachable_others_still_reported(lab, lab_settings, lab_up, capsys):
    settings = dataclasses.replace(lab_settings, connect_retries=1, retry_backoff=0.05)
    labmod.stop_node(lab, 1)
    try:
        code, rep, err = run_facts(lab, settings, capsys)
    finally:
        lab_up()
    assert code == 1
    assert rep["unreachable"] == 1 and rep["failed"] == 0
    assert rep["nodes"]["worker-1"]["status"] == "unreachable"
    assert "connection refused" in rep["nodes"]["worker-1"]["message"]  # a retry can fix that one
    assert "(2 tries)" in rep["nodes"]["worker-1"]["message"]
    assert [rep["nodes"][n]["status"] for n in ("worker-0", "worker-2")] == ["ok", "ok"]
    assert rep["nodes"]["worker-2"]["facts"]["hostname"] == "worker-2"


def test_changed_host_key_refused_others_complete(lab, lab_settings, lab_up, capsys):
    labmod.regenerate_host_key(lab, 2)
    try:
        code, rep, _ = run_facts(lab, lab_settings, capsys)
    finally:
        lab_up()  # the lab made the new key itself, so it re-pins it
    assert code == 1
    bad = rep["nodes"]["worker-2"]
    assert bad["status"] == "failed"
    assert "CHANGED" in bad["message"] and "refusing to connect" in bad["message"]
    assert bad["message"].count("SHA256:") == 2 and "hosts.forget" in bad["message"]
    assert "facts" not in bad
    assert all(rep["nodes"][n]["status"] == "ok" for n in ("worker-0", "worker-1"))
    code, rep, _ = run_facts(lab, lab_settings, capsys)
    assert code == 0


def test_first_contact_is_pinned_and_recorded(lab, lab_settings, tmp_path, capsys):
    fresh = dataclasses.replace(lab_settings, state_dir=str(tmp_path / "state"))
    code = api.facts(FactsOptions(inventory=str(lab.inventory)), fresh)
    err = capsys.readouterr().err
    assert code == 0
    assert err.count("pinned new host key") == len(lab.nodes)
    pinned = fresh.known_hosts.read_text().splitlines()
    assert sorted(line.split()[0] for line in pinned) == sorted(n.address for n in lab.nodes)
    # What was recorded agrees with what OpenSSH sees through the lab's own pinning.
    assert set(pinned) <= set(lab_settings.known_hosts.read_text().splitlines())
    assert api.facts(FactsOptions(inventory=str(lab.inventory)), fresh) == 0
    assert "pinned new host key" not in capsys.readouterr().err


def test_unknown_host_refused_when_pinning_is_off(lab, lab_settings, tmp_path, capsys):
    strict = dataclasses.replace(
        lab_settings, state_dir=str(tmp_path / "s"), pin_new_host_keys=False
    )
    code, rep, _ = run_facts(lab, strict, capsys)
    assert code == 1
    assert {v["status"] for v in rep["nodes"].values()} == {"failed"}
    assert all("not pinned" in v["message"] for v in rep["nodes"].values())
    assert not strict.known_hosts.exists() or strict.known_hosts.read_text() == ""


def test_wrong_key_is_auth_failure_without_retry(lab, lab_settings, tmp_path, capsys):
    key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    inv_dir = tmp_path / "inv"
    shutil.copytree(Path(lab.inventory).parent, inv_dir)
    text = (inv_dir / "hosts.yml").read_text().replace(str(lab.key), str(key))
    (inv_dir / "hosts.yml").write_text(text)
    t0 = time.monotonic()
    code = api.facts(
        FactsOptions(inventory=str(inv_dir), limit="worker-0", json=True), lab_settings
    )
    rep = json.loads(capsys.readouterr().out)
    assert code == 1
    assert rep["nodes"]["worker-0"]["status"] == "unreachable"
    assert "authentication failed" in rep["nodes"]["worker-0"]["message"]
    assert time.monotonic() - t0 < 5


def _fleet(lab, settings, display=None):
    inv = inventory.load(str(lab.inventory))
    return Fleet(inv.hosts, settings, "test", display or Display(io.StringIO()))


def test_fan_out_is_bounded(lab, lab_settings):
    active, peak, lock = [0], [0], threading.Lock()

    def work(s):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        r = s.run("sleep 0.3; hostname")
        with lock:
            active[0] -= 1
        return r.stdout.strip()

    with _fleet(lab, dataclasses.replace(lab_settings, width=2)) as fleet:
        out = fleet.map(work, "sleep")
    assert out == {n.name: n.name for n in lab.nodes}
    assert peak[0] == 2


def test_one_connection_per_node_across_stages(lab, lab_settings):
    with _fleet(lab, lab_settings) as fleet:
        first = fleet.map(lambda s: (id(s.conn.transport), facts.gather(s, [facts.HOSTNAME])), "a")
        second = fleet.map(lambda s: id(s.conn.transport), "b")
    assert {n: v[0] for n, v in first.items()} == second
    assert {n: v[1]["hostname"] for n, v in first.items()} == {n.name: n.name for n in lab.nodes}


def test_connections_negotiate_aes_gcm_and_fall_back_without_it(lab, lab_settings):
    """The lab's real sshd picks AES-GCM (no MAC for paramiko to check in Python). Where CTR
    is the only cipher both sides have (here the client offers only it, as a server without
    GCM would leave it), the connection and its commands still work."""
    from nodeprep.engine import ciphers

    with _fleet(lab, lab_settings) as fleet:
        got = fleet.map(
            lambda s: (s.conn.transport.local_cipher, s.conn.transport.remote_cipher), "c"
        )
    assert set(got.values()) == {("aes128-gcm@openssh.com", "aes128-gcm@openssh.com")}
    assert ciphers.GcmFirst._preferred_ciphers[0] == "aes128-gcm@openssh.com"
    assert set(ciphers.GcmFirst._preferred_ciphers) >= set(paramiko.Transport._preferred_ciphers)

    class CtrOnly(ciphers.GcmFirst):
        _preferred_ciphers = ("aes128-ctr",)  # what an old or FIPS-limited server leaves

    real = ciphers.GcmFirst
    ciphers.GcmFirst = CtrOnly
    try:
        with _fleet(lab, lab_settings) as fleet:
            got = fleet.map(
                lambda s: (s.conn.transport.remote_cipher, s.run("echo ok").stdout), "c"
            )
    finally:
        ciphers.GcmFirst = real
    assert set(got.values()) == {("aes128-ctr", "ok\n")}


def test_command_timeout_and_prefixed_streaming(lab, lab_settings):
    buf = io.StringIO()
    with _fleet(lab, lab_settings, Display(buf)) as fleet:
        res = fleet.map(
            lambda s: (
                s.run("sleep 5", timeout=1),
                s.run("echo one; echo two >&2; echo three", stream=True),
            ),
            "t",
        )
    slow, streamed = res["worker-0"]
    assert slow.timed_out and slow.rc == 124 and "timed out after 1s" in slow.stderr
    # The timeout is enforced on the node: nothing of the command is left running there.
    # (Zombies do not count: this machine's PID 1 reaps orphans late.)
    alive = "ps -u nodeprep -o stat=,comm= | awk '$1 !~ /^Z/ && $2 == \"sleep\"'"
    assert labmod.node_shell(lab, 0, alive).stdout.strip() == ""
    assert streamed.ok and streamed.stdout == "one\nthree\n"
    lines = buf.getvalue().splitlines()
    for node in lab.nodes:
        mine = [ln for ln in lines if ln.startswith(f"[{node.name}] ")]
        assert sorted(mine) == sorted(f"[{node.name}] {w}" for w in ("one", "two", "three"))


def test_cli_bad_inventory_is_one_line_exit_2(tmp_path):
    (tmp_path / "hosts.yml").write_text("hosts:\n  w1: {adress: 10.0.0.1}\n")
    r = subprocess.run(
        [str(ROOT / ".venv/bin/invoke"), "facts", "--inventory", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "hosts.yml:2:" in r.stderr and "did you mean 'address'" in r.stderr
