"""The Slurm transport on a lab with a real Slurm (issue 18): provision and verify-parity
--via slurm give the same per-node results as ssh; a second run changes nothing; a node Slurm
does not know stops the run before any step (one line, exit 2); a task that dies is that
node's failure only; sbcast broadcasts a file (checked per node); inside an allocation
(SLURM_JOB_ID) auto takes the Slurm path and runs its steps in that job.

Lab "slurmx" (its own subnet from its name), 3 nodes, slurmctld on the host, slurmd in each
node. The roles are the ones that need no package index (the transport is the subject)."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.common import select_hosts
from nodeprep.commands.options import ProvisionOptions, VerifyOptions
from nodeprep.commands.provision import provision
from nodeprep.commands.verify import verify
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.engine.transports import slurmrun
from nodeprep.settings import Settings

NAME, NODES = "slurmx", 3
ROLES = "ssh_keys,ssh_config,shell,nccl,deepspeed_env"


@pytest.fixture(scope="module")
def slx(tmp_path_factory):
    from nodeprep.lab import slurm as lab_slurm

    if not lab_slurm.cgroup_controllers():
        pytest.skip(
            "this host mounts no cgroup v1 controllers: "
            "Slurm 22.05's slurmd cannot start in the lab"
        )
    base = tmp_path_factory.mktemp("slurmx")
    settings = Settings(state_dir=str(base / "state"), lab_root=str(base / "labs"), lock_wait=60)
    sets = (f"controller_key={base}/ctl/id", f"controller_ssh_config={base}/ctl/config")
    labmod.down(NAME, settings, log=lambda m: None)

    def up():
        return labmod.up(
            NODES,
            NAME,
            settings,
            labmod.UpOptions(inventory_dir=base / "inv", slurm=True),
            log=lambda m: None,
        )

    yield up(), settings, sets, up
    labmod.down(NAME, settings, log=lambda m: None, purge=True)


def steps(report: dict) -> dict:
    return {
        n: [(s["step"], s["status"], s["message"]) for s in r["steps"]]
        for n, r in report["nodes"].items()
    }


def run(info, settings, sets, via: str) -> dict:
    opts = ProvisionOptions(inventory=str(info.inventory), roles=ROLES, sets=sets, via=via)
    return provision(opts, settings, Events()).report


def test_provision_via_slurm_matches_ssh_and_converges(slx):
    info, settings, sets, up = slx
    cold_ssh = run(info, settings, sets, "ssh")
    labmod.down(NAME, settings, log=lambda m: None, purge=True)  # the same lab, cold again
    info = up()
    cold_slurm = run(info, settings, sets, "slurm")
    assert cold_slurm["changed"] and not cold_slurm["failed"] and not cold_slurm["unreachable"]
    assert steps(cold_slurm) == steps(cold_ssh)
    again = run(info, settings, sets, "slurm")
    assert not again["changed"] and not again["failed"]
    assert all(s == "ok" for n in steps(again).values() for _x, s, _m in n)
    assert not run(info, settings, sets, "ssh")["changed"]  # what ssh sees, too
    # one ssh connection from here: the head's; its log shows the srun steps
    run_dir = Path(again["run_dir"])
    head_log = "".join(p.read_text() for p in (run_dir / "worker-0").glob("*"))
    other_log = "".join(p.read_text() for p in (run_dir / "worker-1").glob("*"))
    assert "srun step over 3 node(s)" in head_log and "srun step" not in other_log


def test_verify_parity_via_slurm_gives_the_same_keys_and_values(slx):
    info, settings, sets, _up = slx
    run(info, settings, sets, "slurm")
    by_ssh = verify(VerifyOptions(inventory=str(info.inventory), via="direct"), settings, Events())
    by_slurm = verify(VerifyOptions(inventory=str(info.inventory), via="slurm"), settings, Events())
    assert by_slurm.report.as_dict() == by_ssh.report.as_dict()
    assert any("srun steps" in n for n in by_slurm.notes)


def test_a_node_slurm_does_not_know_is_one_line_and_exit_2(slx, tmp_path, capsys):
    info, settings, sets, _up = slx
    inv = tmp_path / "hosts.yml"
    inv.write_text(info.inventory.read_text() + "  ghost-9: {address: 10.1.2.3, port: 22}\n")
    assert (
        api.provision(
            ProvisionOptions(inventory=str(inv), roles=ROLES, sets=sets, via="slurm"), settings
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --via slurm: ghost-9 not in the Slurm cluster worker-0 sees")
    assert len(err.splitlines()) == 1
    assert api.verify_parity(VerifyOptions(inventory=str(inv), via="slurm"), settings) == 2
    assert "ghost-9" in capsys.readouterr().err
    assert api.provision(ProvisionOptions(inventory=str(inv), via="nope"), settings) == 2


def test_a_task_that_dies_is_its_nodes_failure_only(slx):
    info, settings, _sets, _up = slx
    _inv, hosts = select_hosts(str(info.inventory), None, settings)
    # worker-1's script kills the task's own shell (its parent's parent): no answer comes back
    die = "kill -9 $(cut -d' ' -f4 /proc/$PPID/stat)"
    with Fleet(hosts, settings, "slurmx-die") as fleet:
        assert slurmrun.use(fleet, "slurm") == "slurm"
        t0 = time.monotonic()
        got = fleet.map(lambda s: s.run(die if s.name == "worker-1" else "echo alive"), "t")
        assert time.monotonic() - t0 < 30
    assert got["worker-1"].rc == 255 and "ended without a result" in got["worker-1"].stderr
    assert [got[n].stdout for n in ("worker-0", "worker-2")] == ["alive\n", "alive\n"]


def test_sbcast_broadcasts_a_file_checked_on_every_node(slx, tmp_path):
    info, settings, _sets, _up = slx
    _inv, hosts = select_hosts(str(info.inventory), None, settings)
    data = os.urandom(3_000_000)
    (tmp_path / "blob").write_bytes(data)
    dest = f"/tmp/nodeprep-bcast-test-{secrets.token_hex(4)}"
    try:
        with Fleet(hosts, settings, "slurmx-bcast") as fleet:
            slurmrun.use(fleet, "slurm")
            names = [h.name for h in hosts]
            assert fleet.transport.broadcast(tmp_path / "blob", dest, names) == {}
            sums = fleet.map(lambda s: s.run(f"sha256sum < {dest}").stdout.split()[0], "check")
            assert set(sums.values()) == {hashlib.sha256(data).hexdigest()}
            bad = fleet.transport.broadcast(tmp_path / "blob", "/nonexistent/dir/x", names)
            assert sorted(bad) == names
    finally:
        subprocess.run(["rm", "-f", dest])


def test_inside_an_allocation_auto_rides_it(slx, monkeypatch):
    info, settings, sets, _up = slx
    # a copy the lab user can read (the lab's directory is root's alone)
    conf = Path(tempfile.mkdtemp()) / "slurm.conf"
    conf.write_text((Path(settings.lab_root) / NAME / "slurm" / "slurm.conf").read_text())
    os.chmod(conf.parent, 0o755)
    os.chmod(conf, 0o644)
    env = dict(os.environ, SLURM_CONF=str(conf))
    # the job is the lab user's, as a user's own allocation is (steps run as that user)
    r = subprocess.run(
        [
            "runuser",
            "-u",
            info.user,
            "--",
            "salloc",
            "--no-shell",
            "-N",
            "3",
            "--nodelist=worker-[0-2]",
            "--immediate=20",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    job = re.search(r"Granted job allocation (\d+)", r.stdout + r.stderr)
    assert job, r.stderr
    # a step of the job (training, say) holds its CPUs: nodeprep's steps must still start
    busy = subprocess.Popen(
        [
            "runuser",
            "-u",
            info.user,
            "--",
            "srun",
            f"--jobid={job.group(1)}",
            "-N",
            "3",
            "--ntasks-per-node=1",
            "sleep",
            "120",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(1)
        monkeypatch.setenv("SLURM_JOB_ID", job.group(1))
        monkeypatch.setenv("SLURM_JOB_NODELIST", "worker-[0-2]")
        assert not run(info, settings, sets, "auto")["failed"]
        res = verify(VerifyOptions(inventory=str(info.inventory)), settings, Events())
        assert not res.report.unreachable and any("srun steps" in n for n in res.notes)
        # the steps ran in that job (it still holds the nodes), not in allocations of their own
        q = subprocess.run(["squeue", "-h", "-o", "%i %N"], capture_output=True, text=True, env=env)
        assert q.stdout.split() == [job.group(1), "worker-[0-2]"] and busy.poll() is None
    finally:
        time.sleep(2)  # the run's last step file goes in the background: let it
        subprocess.run(["scancel", job.group(1)], env=env, capture_output=True)
        busy.wait(timeout=60)
        subprocess.run(["rm", "-rf", str(conf.parent)])


def test_wheels_go_by_sbcast_and_are_checked_on_arrival(slx, tmp_path, monkeypatch):
    """--via slurm, a cold wheelhouse: the controller sends the platform's wheels once (one
    tar, to the head), sbcast puts it on every node, each wheel is checked against the
    controller's sha256 before it is used; nothing is left in .relay or /tmp; a second run
    sends nothing."""
    import json
    import shutil

    from tests.integration.synthetic import make_wheel
    from tests.integration.test_fanout import sums

    info, settings, sets, _up = slx
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for i in range(2):
        make_wheel(wheels, f"npcast{i}", 1_000_000 + i)
    (tmp_path / "req.txt").write_text("npcast0==1.0\nnpcast1==1.0\n")
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the controller's pip: the made wheels
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    extra = (f"python_requirements=[{tmp_path / 'req.txt'}]", "wheel_builds={}", "torch_version=")
    for n in info.nodes:
        shutil.rmtree(Path(n.home) / ".nodeprep" / "wheelhouse", ignore_errors=True)
    opts = ProvisionOptions(
        inventory=str(info.inventory), roles="wheelhouse", sets=sets + extra, via="slurm"
    )
    rep = provision(opts, settings, Events()).report
    assert not rep["failed"] and not rep["unreachable"], json.dumps(rep)[-2000:]
    w = {n: r.get("wheelhouse") for n, r in rep["nodes"].items()}
    assert all(
        x["from"] == "sbcast"
        and x["verified_on_arrival"] == 2
        and x["fallback"] is None
        and x["relay_error"] is None
        for x in w.values()
    ), w
    total = sum(p.stat().st_size for p in wheels.glob("*.whl"))
    sent = sum(x["controller_bytes"] for x in w.values())
    assert total <= sent <= total * 1.02  # one tar (plus its headers)
    for n in info.nodes:
        d = Path(n.home) / ".nodeprep" / "wheelhouse"
        assert sums(d) == sums(wheels) and not (d / ".relay").exists()
    assert not list(Path("/tmp").glob("nodeprep-wheels-*"))
    again = provision(opts, settings, Events()).report
    assert not again["changed"] and not any(r.get("wheelhouse") for r in again["nodes"].values())
