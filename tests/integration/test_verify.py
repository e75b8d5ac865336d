"""verify-parity on the provisioned lab through real sshd: parity on a fresh fleet, and each
hand-made difference on ONE node detected with the node and key named."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import ProvisionOptions, VerifyOptions

VENV = "/home/nodeprep/.nodeprep/venv"


@pytest.fixture(scope="module")
def fleet(lab, lab_settings, lab_up, tmp_path_factory):
    """The whole site applied with one set of settings, so the fleet is in parity."""
    lab_up()
    ctl = tmp_path_factory.mktemp("ctl")
    sets = [f"controller_key={ctl}/id", f"controller_ssh_config={ctl}/config"]

    def provision():
        code = api.provision(
            ProvisionOptions(inventory=str(lab.inventory), sets=tuple(sets or ())), lab_settings
        )
        assert code == 0

    provision()
    return provision


def verify(lab, settings, capsys, inventory=None, **kw):
    code = api.verify_parity(
        VerifyOptions(inventory=str(inventory or lab.inventory), limit=None, json=True, **kw),
        settings,
    )
    out = capsys.readouterr()
    return code, json.loads(out.out)


def drift_of(rep) -> dict:
    return {d["key"]: {tuple(g["nodes"]): g["value"] for g in d["groups"]} for d in rep["drift"]}


def test_fresh_fleet_is_in_parity(fleet, lab, lab_settings, capsys):
    code, rep = verify(lab, lab_settings, capsys)
    assert code == 0, rep
    assert rep["ok"] is True and rep["drift"] == [] and rep["unreachable"] == {}
    assert rep["compared_keys"] > 30
    code = api.verify_parity(VerifyOptions(inventory=str(lab.inventory)), lab_settings)
    assert code == 0 and capsys.readouterr().out.strip().splitlines()[-1].startswith(
        "PARITY OK: 3 nodes"
    )


def test_other_package_version_on_one_node(fleet, lab, lab_settings, lab_ssh, capsys, tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "-d",
            str(tmp_path),
            "einops==0.8.1",
        ],
        check=True,
        capture_output=True,
    )
    whl = next(tmp_path.glob("einops-0.8.1-*.whl"))
    shutil.copy(whl, Path(lab.nodes[2].home) / whl.name)
    r = lab_ssh(2, f"{VENV}/bin/python -m pip install -q --no-index ~/{whl.name}")
    assert r.returncode == 0, r.stderr
    try:
        code, rep = verify(lab, lab_settings, capsys)
    finally:
        fleet()
    assert code == 1 and rep["ok"] is False
    assert drift_of(rep) == {
        "pkg.einops": {("worker-0", "worker-1"): "0.8.2", ("worker-2",): "0.8.1"}
    }


def test_probes_ride_the_head_logins(fleet, lab, lab_settings, capsys):
    """--mesh head: ONE connection from the controller (to worker-0); its ssh logins to every
    node carry their probes, so the other nodes see no connection of their own."""
    code, rep = verify(lab, lab_settings, capsys, mesh="head")
    assert code == 0, rep
    assert rep["compared_keys"] > 30 and rep["checks"] == []
    run = Path(lab_settings.runs) / "latest"
    head = (run / "worker-0" / "probe.log").read_text()
    assert "probes of 3 node(s) over the ssh mesh from worker-0 (3 logins)" in head
    for n in ("worker-1", "worker-2"):
        log = (run / n / "probe.log").read_text()
        assert "probed through worker-0's ssh login" in log and "$ " not in log
    # --via direct: the same verdict over a connection per node
    code, rep2 = verify(lab, lab_settings, capsys, mesh="head", via="direct")
    assert code == 0 and rep2["compared_keys"] == rep["compared_keys"]
    assert (
        "$ verify probe"
        in (Path(lab_settings.runs) / "latest" / "worker-1" / "probe.log").read_text()
    )


def test_node_the_head_cannot_log_in_to_is_probed_directly(fleet, lab, lab_settings, capsys):
    """worker-0's known_hosts loses worker-1: its login there fails (host key unknown, never
    auto-added), the pair is named, and worker-1's facts still come, over its own connection."""
    kh = Path(lab.nodes[0].home) / ".ssh" / "known_hosts"
    good = kh.read_text()
    cut = "".join(
        ln for ln in good.splitlines(True) if not ln.split(" ")[0].split(",").count("worker-1")
    )
    kh.write_text(cut)
    try:
        code = api.verify_parity(
            VerifyOptions(inventory=str(lab.inventory), mesh="head"), lab_settings
        )
        out = capsys.readouterr().out
        assert kh.read_text() == cut  # nothing was added behind the user's back
    finally:
        kh.write_text(good)
    assert code == 1
    assert "worker-0 -> worker-1: login failed (exit 255)" in out
    assert "probes rode worker-0's logins; probed directly: worker-1" in out
    assert "unreachable" not in out.lower() and "DRIFT" not in out  # its facts came and match


@pytest.mark.parametrize("mesh", ["auto", "head"])  # head: the probes ride worker-0's logins
def test_changed_and_missing_deepspeed_env_lines(fleet, lab, lab_settings, capsys, mesh):
    env = Path(lab.nodes[1].home) / ".deepspeed_env"
    good = env.read_text()
    lines = good.splitlines(True)
    env.write_text("".join(ln for ln in lines if not ln.startswith("PATH=")) + "EXTRA=1\n")
    try:
        code, rep = verify(lab, lab_settings, capsys, mesh=mesh)
    finally:
        env.write_text(good)
    assert code == 1
    d = drift_of(rep)
    assert set(d) == {"env.deepspeed.EXTRA", "env.deepspeed.PATH"}
    assert d["env.deepspeed.EXTRA"] == {("worker-0", "worker-2"): None, ("worker-1",): "1"}
    assert d["env.deepspeed.PATH"][("worker-1",)] is None


def test_other_login_shell_on_one_node(fleet, lab, lab_settings, lab_restore, capsys):
    node_dir = Path(lab.nodes[0].home).parent
    subprocess.run(
        ["usermod", "--prefix", str(node_dir), "--shell", "/usr/bin/zsh", lab.user], check=True
    )
    code, rep = verify(lab, lab_settings, capsys)
    assert code == 1
    assert drift_of(rep)["shell.login"] == {
        ("worker-1", "worker-2"): "/bin/bash",
        ("worker-0",): "/usr/bin/zsh",
    }


def test_cluster_key_removed_from_one_node_breaks_named_pairs(fleet, lab, lab_settings, capsys):
    ak = Path(lab.nodes[1].home) / ".ssh" / "authorized_keys"
    good = ak.read_text()
    ak.write_text("".join(ln for ln in good.splitlines(True) if "nodeprep cluster" not in ln))
    try:
        code, rep = verify(lab, lab_settings, capsys)
    finally:
        ak.write_text(good)
    assert code == 1
    failed = sorted(c["message"].split(":")[0] for c in rep["checks"] if c["key"] == "ssh.mesh")
    assert failed == ["worker-0 -> worker-1", "worker-1 -> worker-1", "worker-2 -> worker-1"]
    assert all(
        "login failed (exit 255)" in c["message"] for c in rep["checks"] if c["key"] == "ssh.mesh"
    )


def test_pairs_without_a_real_login_are_checked_on_paper(fleet, lab, lab_settings, capsys):
    """--mesh head: real logins only from worker-0; the other pairs come from the files: a
    cluster key missing from worker-0's authorized_keys and a known_hosts line missing on
    worker-2 are named pair by pair."""
    ak = Path(lab.nodes[0].home) / ".ssh" / "authorized_keys"
    kh = Path(lab.nodes[2].home) / ".ssh" / "known_hosts"
    good_ak, good_kh = ak.read_text(), kh.read_text()
    ak.write_text("".join(ln for ln in good_ak.splitlines(True) if "nodeprep cluster" not in ln))
    kh.write_text(
        "".join(
            ln
            for ln in good_kh.splitlines(True)
            if not ln.split(" ")[0].split(",").count("worker-1")
        )
    )
    try:
        code, rep = verify(lab, lab_settings, capsys, mesh="head")
    finally:
        ak.write_text(good_ak)
        kh.write_text(good_kh)
    assert code == 1
    msgs = sorted(c["message"] for c in rep["checks"] if c["key"] == "ssh.mesh")
    assert [m.split(":")[0] for m in msgs] == [
        "worker-0 -> worker-0",
        "worker-1 -> worker-0",
        "worker-2 -> worker-0",
        "worker-2 -> worker-1",
    ]
    assert "login failed (exit 255)" in msgs[0]  # the real one
    assert (
        "worker-0's ~/.ssh/authorized_keys lacks the cluster key worker-1 logs in with" in msgs[1]
    )
    assert "worker-2's ~/.ssh/known_hosts has no host key for worker-1" in msgs[3]
    code, rep = verify(lab, lab_settings, capsys, mesh="head")
    assert code == 0, rep["checks"]


@pytest.mark.parametrize("mesh", ["auto", "head"])  # head: two different probes fanned out
def test_venv_at_another_path_on_one_node(fleet, lab, lab_settings, capsys, tmp_path, mesh):
    home = Path(lab.nodes[2].home)
    (home / ".nodeprep" / "venv").rename(home / "venv2")
    inv = yaml.safe_load(Path(lab.inventory).read_text())
    inv["hosts"]["worker-2"]["venv_path"] = "/home/nodeprep/venv2"
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inv))
    try:
        code, rep = verify(lab, lab_settings, capsys, inventory=tmp_path, mesh=mesh)
    finally:
        (home / "venv2").rename(home / ".nodeprep" / "venv")
    assert code == 1
    assert drift_of(rep)["python.path"] == {
        ("worker-0", "worker-1"): f"{VENV}/bin/python",
        ("worker-2",): "/home/nodeprep/venv2/bin/python",
    }


@pytest.mark.parametrize("mesh", ["auto", "head"])  # head: worker-0's login fails, then ours
def test_down_node_is_unreachable_and_others_compared(
    fleet, lab, lab_settings, lab_up, capsys, mesh
):
    import dataclasses

    settings = dataclasses.replace(lab_settings, connect_retries=0)
    labmod.stop_node(lab, 2)
    try:
        code, rep = verify(lab, settings, capsys, mesh=mesh)
    finally:
        lab_up()
    assert code == 1
    assert list(rep["unreachable"]) == ["worker-2"] and rep["drift"] == []
    # worker-0 -> worker-2 fails too (it is down), and is named.
    assert any("-> worker-2" in c["message"] for c in rep["checks"])


def test_baseline_reports_what_changed_since(fleet, lab, lab_settings, capsys, tmp_path):
    base = tmp_path / "fleet.json"
    code, _rep = verify(lab, lab_settings, capsys, save_baseline=str(base))
    assert code == 0 and base.exists()
    env = Path(lab.nodes[0].home) / ".deepspeed_env"
    good = env.read_text()
    env.write_text(good + "LATER=1\n")
    try:
        code, rep = verify(lab, lab_settings, capsys, baseline=str(base))
    finally:
        env.write_text(good)
    assert code == 1
    (d,) = rep["drift"]
    assert d["key"] == "env.deepspeed.LATER"
    assert [(g["nodes"], g["value"], g.get("label")) for g in d["groups"]] == [
        (["worker-0"], None, "baseline"),
        (["worker-0"], "1", "now"),
    ]
    code, rep = verify(lab, lab_settings, capsys, baseline=str(base))
    assert code == 0


def test_bad_baseline_file_is_input_error(lab, lab_settings, capsys, tmp_path):
    bad = tmp_path / "b.json"
    bad.write_text("{not json")
    code = api.verify_parity(
        VerifyOptions(inventory=str(lab.inventory), baseline=str(bad)), lab_settings
    )
    err = capsys.readouterr().err
    assert code == 2 and str(bad) in err and err.count("\n") == 1


def test_collective_all_reduce_through_the_launcher(fleet, lab, lab_settings, capsys, tmp_path):
    fps = tmp_path / "fps.json"
    code, rep = verify(lab, lab_settings, capsys, collective=True, save_baseline=str(fps))
    assert code == 0, rep.get("collective")
    c = rep["collective"]
    assert (
        c["ok"] and c["launcher"] == "torchrun" and c["world_size"] == 3 and c["backend"] == "gloo"
    )
    assert [s["bytes"] for s in c["sizes"]] == [1024, 4096, 16384, 65536, 262144, 1048576, 4194304]
    assert all(s["correct"] and s["busbw_gbps"] > 0 and s["time_us"] > 0 for s in c["sizes"])
    # CPU torch and gloo: no libnccl to map, no NCCL log: the NCCL keys are absent, not None
    assert "nccl" not in c
    saved = json.loads(fps.read_text())["fingerprints"]
    assert len(saved) == 3
    for fp in saved.values():
        assert fp["torch.version"].endswith("+cpu") and fp["torch.cuda"] is None
        assert fp["torch.nccl"] is None  # the build's NCCL: a CPU build has none
        assert [k for k in fp if k.startswith("nccl.")] == []
