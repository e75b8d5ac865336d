"""Cluster shapes the default lab does not have, through real sshd: one home shared by every
node (bind-mounted, as NFS would be) and two inventory nodes on one machine (worker-3 reaches
worker-0's namespace again). Provision converges on the first try and acts once per home,
verify-parity sees no false drift, train runs; two provisions at once do not interleave, and a
run killed with kill -9 leaves a lock the next run takes over."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import ProvisionOptions, TrainOptions, VerifyOptions

NAME, SUBNET = (
    "tsh",
    194,
)  # 10.194.0.0/16: apart from the other labs (tests/integration/conftest.py)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The module's directory: its labs' state, lab roots and inventories."""
    return tmp_path_factory.mktemp("shapes")


@pytest.fixture(scope="module")
def settings(base, own_settings):
    """The module's labs' settings: the run's controller wheelhouse (built once per run)."""
    return own_settings(base)


@pytest.fixture(scope="module")
def shared(settings, base):
    labmod.down(NAME, settings, log=lambda msg: None)
    info = labmod.up(
        3,
        NAME,
        settings,
        labmod.UpOptions(inventory_dir=base / "inv", subnet=SUBNET, shared_home=True, aliases=1),
        log=lambda msg: None,
    )
    ctl = base / "ctl"
    sets = (f"controller_key={ctl}/id", f"controller_ssh_config={ctl}/config")
    yield info, settings, sets
    labmod.down(NAME, settings, log=lambda msg: None)


def provision(info, settings, sets, capsys):
    code = api.provision(
        ProvisionOptions(inventory=str(info.inventory), json=True, sets=sets), settings
    )
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


def home(info) -> Path:
    return info.nodes[0].home.resolve()


def test_lab_shapes(shared):
    info, _settings, _sets = shared
    assert all(n.home.resolve() == home(info) for n in info.nodes)  # one home for all
    hosts = info.inventory.read_text()
    assert f"worker-3: {{address: 10.{SUBNET}.0.10" in hosts  # worker-0's machine again
    ids = {(n.home.parent / "etc" / "machine-id").read_text() for n in info.nodes}
    assert len(ids) == 3  # a machine id per node


def test_shared_home_provision_acts_once_and_converges(shared, capsys):
    info, settings, sets = shared
    code, rep, err = provision(info, settings, sets, capsys)
    assert code == 0, rep
    assert "worker-[0-3] share one home (worker-0 acts for it)" in err
    assert "worker-[0,3] are one machine (worker-0 acts for it)" in err
    nodes = rep["nodes"]
    installs = [
        n
        for n, r in nodes.items()
        for s in r["steps"]
        if s["step"].startswith("venv: pip.install") and s["status"] == "changed"
    ]
    assert installs == ["worker-0"]  # the venv is installed once
    for n in ("worker-1", "worker-2", "worker-3"):
        pip = next(s for s in nodes[n]["steps"] if s["step"].startswith("venv: pip.install"))
        assert pip == {"step": pip["step"], "status": "ok", "message": "by worker-0 (shared home)"}
    code, rep, _ = provision(info, settings, sets, capsys)
    assert code == 0 and rep["changed"] == 0, rep  # nothing to change the second time
    assert not (home(info) / ".nodeprep" / "lock").exists()


def test_verify_and_train_on_the_shared_home(shared, capfd):
    info, settings, _sets = shared
    for _ in range(2):  # the torch cache, cold then warm
        code = api.verify_parity(VerifyOptions(inventory=str(info.inventory)), settings)
        out = capfd.readouterr().out
        assert code == 0 and "PARITY OK: 4 nodes" in out, out
    assert "worker-[0-3] share one home" in out
    for launcher, payload in (("deepspeed", "health"), ("torchrun", "ddp")):
        code = api.train(
            TrainOptions(
                inventory=str(info.inventory), launcher=launcher, payload=payload, timeout=180
            ),
            settings,
        )
        cap = capfd.readouterr()
        assert code == 0, cap.out[-3000:] + cap.err[-2000:]
        assert "(1 home(s))" in cap.out + cap.err  # the job dir synced once


def _invoke(info, settings, sets, log: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "INVOKE_NODEPREP_STATE_DIR": settings.state_dir,
        "INVOKE_NODEPREP_LAB_ROOT": settings.lab_root,
    }
    argv = [str(ROOT / ".venv/bin/invoke"), "provision", "--inventory", str(info.inventory)]
    for s in sets:
        argv += ["--set", s]
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_two_provisions_at_once_take_turns(shared, tmp_path):
    info, settings, sets = shared
    shutil.rmtree(home(info) / ".nodeprep" / "venv")  # real work for the first one to hold
    runs = [_invoke(info, settings, sets, tmp_path / f"run{i}.log") for i in range(2)]
    codes = [p.wait(timeout=600) for p in runs]
    logs = [(tmp_path / f"run{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], logs
    assert sum("waiting up to" in text for text in logs) >= 1  # one waited for the other
    assert sum("nothing to change" in text for text in logs) == 1  # and found it done
    venv_python = home(info) / ".nodeprep" / "venv" / "bin" / "python"
    assert subprocess.run([str(venv_python), "-c", "import torch, deepspeed"]).returncode == 0


def test_killed_run_leaves_a_lock_the_next_run_takes_over(shared, tmp_path, capsys):
    info, settings, sets = shared
    nodeprep = home(info) / ".nodeprep"
    shutil.rmtree(nodeprep / "venv")
    run = _invoke(info, settings, sets, tmp_path / "killed.log")
    deadline = time.monotonic() + 120
    while not (nodeprep / "venv").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (nodeprep / "venv").exists(), (tmp_path / "killed.log").read_text()
    time.sleep(1)
    os.killpg(run.pid, signal.SIGKILL)  # mid-install, no cleanup at all
    run.wait()
    owner = (nodeprep / "lock" / "owner").read_text().split()
    assert owner[1] == str(run.pid)
    code, rep, err = provision(info, settings, sets, capsys)
    assert code == 0, rep
    assert "took over the lock of the home of worker-[0-3]" in err and "is gone" in err
    code, rep, _ = provision(info, settings, sets, capsys)
    assert code == 0 and rep["changed"] == 0, rep


@pytest.fixture(scope="module")
def nics(settings, base, site_copy):
    """Nodes whose interfaces are named differently (eno1, eth0), private homes, each holding
    the site's Python stack (copied: provision verifies it rather than installing it cold)."""
    labmod.down("tnic", settings, log=lambda msg: None)
    info = labmod.up(
        2,
        "tnic",
        settings,
        labmod.UpOptions(inventory_dir=base / "nicinv", subnet=195, nic_names=("eno1", "eth0")),
        log=lambda msg: None,
    )
    for node in info.nodes:
        site_copy(node.home)
    yield (
        info,
        settings,
        (f"controller_key={base}/nicctl/id", f"controller_ssh_config={base}/nicctl/config"),
    )
    labmod.down("tnic", settings, log=lambda msg: None)


def test_differing_nic_names_get_a_value_that_fits_every_node(nics, capfd):
    info, settings, sets = nics
    code, rep, _err = provision(info, settings, sets, capfd)
    assert code == 0, rep
    assert any("NCCL_SOCKET_IFNAME='=eno1,eth0'" in n for n in rep["notes"]), rep["notes"]
    for node in info.nodes:
        env = (node.home / ".nodeprep" / "env.sh").read_text()
        assert "export NCCL_SOCKET_IFNAME==eno1,eth0\n" in env
    assert api.verify_parity(VerifyOptions(inventory=str(info.inventory)), settings) == 0
    capfd.readouterr()
    code = api.train(
        TrainOptions(
            inventory=str(info.inventory), launcher="torchrun", payload="ddp", timeout=180
        ),
        settings,
    )
    cap = capfd.readouterr()
    assert code == 0 and "ddp: done" in cap.out + cap.err, cap.out[-3000:] + cap.err[-2000:]


def test_a_value_that_selects_no_interface_is_named_before_train(nics, capsys):
    info, settings, sets = nics
    bad = sets + ('nccl_env={NCCL_SOCKET_IFNAME: "=eth9"}',)
    code = api.provision(
        ProvisionOptions(inventory=str(info.inventory), limit="worker-1", json=True, sets=bad),
        settings,
    )
    assert code == 0, capsys.readouterr().out
    capsys.readouterr()
    try:
        code = api.verify_parity(VerifyOptions(inventory=str(info.inventory), json=True), settings)
        rep = json.loads(capsys.readouterr().out)
        assert code == 1
        named = [c for c in rep["checks"] if c["key"] == "net.NCCL_SOCKET_IFNAME"]
        assert [c["node"] for c in named] == ["worker-1"] and "matches no interface here" in named[
            0
        ]["message"]
    finally:
        provision(info, settings, sets, capsys)  # back as the lab makes it


def test_a_tcsh_user_without_sudo_is_named_with_the_fallback(nics, capsys):
    """The lab's worker-1: login shell tcsh and no sudo at all. nodeprep cannot change the
    login shell there: that node fails with the way out, the other one is provisioned."""
    info, settings, sets = nics
    node_dir = info.nodes[1].home.parent
    labmod.up(
        2,
        "tnic",
        settings,
        labmod.UpOptions(inventory_dir=info.inventory.parent, subnet=195, no_sudo=(1,)),
        log=lambda msg: None,
    )
    subprocess.run(
        ["usermod", "--prefix", str(node_dir), "--shell", "/bin/tcsh", info.user], check=True
    )
    try:
        code, rep, _err = provision(info, settings, sets, capsys)
        assert code == 1 and rep["nodes"]["worker-0"]["status"] in ("ok", "changed"), rep
        bad = rep["nodes"]["worker-1"]
        shell = next(s for s in bad["steps"] if s["step"] == "shell: user.shell /bin/bash")
        assert shell["status"] == "failed" and "chsh -s /bin/bash" in shell["message"], bad
        assert "no passwordless sudo" in bad.get("stderr_tail", ""), bad
    finally:
        subprocess.run(
            ["usermod", "--prefix", str(node_dir), "--shell", "/bin/bash", info.user], check=True
        )
        labmod.up(
            2,
            "tnic",
            settings,
            labmod.UpOptions(inventory_dir=info.inventory.parent, subnet=195),
            log=lambda msg: None,
        )
