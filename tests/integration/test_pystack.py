"""The Python stack on the lab through real sshd and real pip: wheelhouse pushed once, venv
(ensurepip and the offline no-pip bootstrap), torch 2.13.0+cpu + deepspeed + numpy installed
with --no-index, verified; drift restored; a node on another Python version refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from nodeprep import cli as api
from nodeprep.commands.options import ProvisionOptions

ROLES = "wheelhouse,venv,torch,deepspeed_env"
VENV = "/home/nodeprep/.nodeprep/venv"


@pytest.fixture(scope="module")
def run(lab, lab_settings, tmp_path_factory):
    ctl = tmp_path_factory.mktemp("ctl")

    def go(*sets, inventory=None, limit=None, check=False, capsys):
        code = api.provision(
            ProvisionOptions(
                inventory=str(inventory or lab.inventory),
                limit=limit,
                roles=ROLES,
                check_mode=check,
                diff=False,
                json=True,
                sets=(f"controller_key={ctl}/id", f"controller_ssh_config={ctl}/config", *sets),
            ),
            lab_settings,
        )
        out = capsys.readouterr()
        return code, (json.loads(out.out) if code != 2 else None), out.err

    return go


def freeze(rep, node):
    return {p.split("==")[0]: p.split("==")[1] for p in rep["nodes"][node]["pip_freeze"]}


def test_stack_installed_offline_then_nothing_pushed(run, lab, lab_ssh, capsys):
    code, rep, _ = run(capsys=capsys)
    assert code == 0, {n: (r["status"], r.get("message")) for n, r in rep["nodes"].items()}
    for n in lab.nodes:
        f = freeze(rep, n.name)
        assert (f["torch"], f["deepspeed"], f["numpy"]) == ("2.13.0+cpu", "0.19.8", "2.4.6")
    downloads = [c for c in rep["controller"] if c["step"].startswith("wheelhouse.download")]
    assert len(downloads) == 1  # one platform in the lab, whatever the node count
    r = lab_ssh(
        1,
        f"{VENV}/bin/python -c 'import torch, deepspeed; print(torch.__version__, "
        f"torch.version.cuda, deepspeed.__version__)'",
    )
    assert r.stdout.split()[-3:] == ["2.13.0+cpu", "None", "0.19.8"], r.stderr
    env = (Path(lab.nodes[0].home) / ".deepspeed_env").read_text()
    assert f"PATH={VENV}/bin:" in env
    code, rep, _ = run(capsys=capsys)
    assert code == 0 and rep["changed"] == 0
    assert [
        c["status"] for c in rep["controller"] if c["step"].startswith("wheelhouse.download")
    ] == ["ok"]
    logs = "".join(p.read_text() for p in Path(rep["run_dir"]).rglob("*.log"))
    assert logs and "pushed " not in logs  # (no logs at all would prove nothing)


def test_package_drift_is_found_and_restored(run, lab, lab_ssh, capsys):
    assert lab_ssh(0, f"{VENV}/bin/python -m pip uninstall -q -y numpy").returncode == 0
    code, rep, _ = run(check=True, capsys=capsys)
    drifted = {
        n: [s["step"] for s in r["steps"] if s["status"] == "changed"]
        for n, r in rep["nodes"].items()
        if r["changed"]
    }
    # numpy's files are gone from under torch: the import torch last passed is verified again
    assert drifted == {
        "worker-0": ["venv: pip.install requirements.lock", "torch: torch.verify torch==2.13.0+cpu"]
    }
    code, rep, _ = run(capsys=capsys)
    assert code == 0 and freeze(rep, "worker-0")["numpy"] == "2.4.6"
    code, rep, _ = run(check=True, capsys=capsys)
    assert code == 0 and rep["changed"] == 0, rep


def test_python_without_ensurepip_gets_a_venv_offline(run, lab, lab_ssh, capsys):
    # venv strips PYTHONPATH/PYTHONHOME before it runs ensurepip, so a missing ensurepip cannot
    # be faked by shadowing; this interpreter fails `-m venv` the way Debian's python3 without
    # python3-venv does. Everything after that (venv --without-pip, pip from its pushed wheel,
    # the offline installs) is real.
    home = Path(lab.nodes[1].home)
    wrapper = home / "bin" / "python3-noensurepip"
    wrapper.parent.mkdir(exist_ok=True)
    wrapper.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" -m venv "*) case " $* " in *" --without-pip "*) ;; *)\n'
        "  echo 'The virtual environment was not created successfully because ensurepip is not\n"
        "available.  On Debian/Ubuntu systems, you need to install the python3-venv package' >&2\n"
        "  exit 1;; esac;; esac\n"
        'exec /usr/bin/python3 "$@"\n'
    )
    wrapper.chmod(0o755)
    shutil.chown(wrapper, "nodeprep")
    py = "/home/nodeprep/bin/python3-noensurepip"
    probe = lab_ssh(1, f"{py} -m venv /tmp/np-probe-venv")
    assert probe.returncode != 0 and "ensurepip is not" in probe.stderr
    shutil.rmtree(home / ".nodeprep" / "venv")
    code, rep, _ = run(f"python={py}", limit="worker-1", capsys=capsys)
    assert code == 0, rep
    f = freeze(rep, "worker-1")
    assert f["torch"] == "2.13.0+cpu" and f["pip"] == "26.3"  # pip from the pushed wheel


def test_no_pip_bootstrap_on_request(run, lab, capsys):
    home = Path(lab.nodes[2].home)
    shutil.rmtree(home / ".nodeprep" / "venv")
    code, rep, _ = run("venv_bootstrap=no-pip", limit="worker-2", capsys=capsys)
    assert code == 0, rep
    assert freeze(rep, "worker-2")["pip"] == "26.3"  # the pushed wheel, not the bundled one


def test_node_on_another_python_version_is_refused(run, lab, tmp_path, capsys):
    fake = Path(lab.nodes[2].home) / "bin" / "python3.10"
    fake.parent.mkdir(exist_ok=True)
    # Answers the probe like a Python 3.10 would; the venv role must stop before using it.
    fake.write_text("#!/bin/sh\necho /opt/py310/bin/python3.10; echo 3.10.14; echo glibc 2.36\n")
    fake.chmod(0o755)
    inv = yaml.safe_load(Path(lab.inventory).read_text())
    inv["hosts"]["worker-2"]["python"] = "/home/nodeprep/bin/python3.10"
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inv))
    code, rep, err = run(inventory=tmp_path, capsys=capsys)
    assert code == 1, err
    bad = rep["nodes"]["worker-2"]
    assert bad["status"] == "failed"
    msg = next(s["message"] for s in bad["steps"] if s["status"] == "failed")
    assert "Python 3.10.14 here, 3.11.2 on the rest of the fleet" in msg
    assert rep["nodes"]["worker-0"]["status"] in ("ok", "changed")  # the others go on


def test_unpinned_requirement_is_refused_before_any_node(run, lab, tmp_path, capsys):
    req = tmp_path / "node.txt"
    req.write_text("numpy==2.4.6\ntorch\n")
    code, _rep, err = run(f"python_requirements=[{req}]", capsys=capsys)
    assert code == 2
    assert f"{req}:2: torch is not pinned" in err and err.count("\n") == 1


def test_venv_path_home_itself_is_refused(run, capsys):
    code, _rep, err = run("venv_path=~/", capsys=capsys)
    assert code == 2 and "must be a directory of its own" in err


def test_two_roles_blocks_in_one_new_env_file(lab, lab_settings, lab_ssh, capsys):
    env = Path(lab.nodes[0].home) / ".nodeprep" / "env.sh"
    env.unlink()
    code = api.provision(
        ProvisionOptions(
            inventory=str(lab.inventory),
            limit="worker-0",
            roles="shell,nccl,venv",
            check_mode=False,
            diff=False,
            json=True,
            sets=("nccl_env={NCCL_DEBUG: WARN}",),
        ),
        lab_settings,
    )
    rep = json.loads(capsys.readouterr().out)
    assert code == 0, rep
    text = env.read_text()
    assert "export NCCL_DEBUG=WARN" in text and f"export PATH={VENV}/bin" in text
    r = lab_ssh(0, "echo $NCCL_DEBUG; command -v python")
    assert r.stdout.split() == ["WARN", f"{VENV}/bin/python"]
