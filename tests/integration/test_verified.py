""" "Nothing to change" means verified, on the lab through real sshd: after a full provision,
each role's state is broken behind nodeprep's back the way its action verifies it (a managed
block edited, a key's mode, the login shell, a wheel rewritten in place at the same size, a
package's metadata gone, numpy's extension module truncated, the venv's python gone), and
`--check` reports every one of those steps as one to change, never "ok"; a run repairs them
all and the next changes nothing. A step whose action failed (torch that does not import) is
never "ok" on the next run."""

from __future__ import annotations

import json
import subprocess

import pytest

from nodeprep import cli as api
from nodeprep.commands.options import ProvisionOptions

VENV = "~/.nodeprep/venv"
SITE = f"{VENV}/lib/python3*/site-packages"
WHEELS = "~/.nodeprep/wheelhouse"

# node -> [(sh run as the lab user on it, the step (start of its name) that must not be "ok")]
BREAKS = {
    0: [
        (
            "sed -i '/^# BEGIN nodeprep ssh_keys/a # stray' ~/.ssh/authorized_keys",
            "ssh_keys: file.block ~/.ssh/authorized_keys",
        ),
        (
            "chmod 644 ~/.ssh/nodeprep_cluster_ed25519",
            "ssh_keys: file.content ~/.ssh/nodeprep_cluster_ed25519",
        ),
        (
            "printf 'x' >> ~/.ssh/nodeprep_cluster_ed25519.pub",
            "ssh_keys: file.content ~/.ssh/nodeprep_cluster_ed25519.pub",
        ),
        (
            "sed -i '/^# BEGIN nodeprep cluster hosts/a # stray' ~/.ssh/known_hosts",
            "ssh_keys: file.block ~/.ssh/known_hosts",
        ),
        (
            "sed -i '/^# BEGIN nodeprep hosts/a # stray' ~/.ssh/config",
            "ssh_config: file.block ~/.ssh/config",
        ),
        (
            "sed -i '/^# BEGIN nodeprep env/,/^# END nodeprep env/d' ~/.bashrc",
            "shell: file.block ~/.bashrc",
        ),
        ("echo EXTRA=1 >> ~/.deepspeed_env", "deepspeed_env: file.content ~/.deepspeed_env"),
        (f"rm -f {VENV}/bin/python", "venv: venv.create"),
    ],
    1: [
        (
            f"set -- {WHEELS}/numpy-*.whl && "
            'printf X | dd of="$1" bs=1 seek=4096 conv=notrunc status=none',
            "wheelhouse: wheelhouse.sync",
        ),
        (
            f"echo '# mine' >> {WHEELS}/requirements.lock",
            "wheelhouse: file.content ~/.nodeprep/wheelhouse/requirements.lock",
        ),
        (f"rm -rf {SITE}/filelock-*.dist-info", "venv: pip.install"),
        (
            "sed -i '/^# BEGIN nodeprep nccl/a export STRAY=1' ~/.nodeprep/env.sh",
            "nccl: file.block ~/.nodeprep/env.sh [nccl]",
        ),
        (
            "sed -i '/^# BEGIN nodeprep venv/a export STRAY=1' ~/.nodeprep/env.sh",
            "venv: file.block ~/.nodeprep/env.sh [venv]",
        ),
    ],
    2: [
        (f'set -- {SITE}/numpy/_core/_multiarray_umath.*.so && : > "$1"', "torch: torch.verify"),
        # the same break: pip keeps numpy (its version matches) unless told it changed
        ("true", "venv: pip.install"),
    ],
}


def _provision(lab, settings, sets, capsys, check=False):
    code = api.provision(
        ProvisionOptions(inventory=str(lab.inventory), check_mode=check, json=True, sets=sets),
        settings,
    )
    out = capsys.readouterr().out
    return code, json.loads(out[out.index("{\n") :])


def _statuses(rep, node) -> dict[str, str]:
    return {s["step"]: s["status"] for s in rep["nodes"][node]["steps"]}


def _named(statuses: dict, start: str) -> list[str]:
    return [s for s in statuses if s.startswith(start)]


def test_every_broken_step_is_found_then_repaired(provisioned, lab, lab_settings, lab_ssh, capsys):
    code, rep = _provision(lab, lab_settings, provisioned, capsys)
    assert code == 0 and rep["changed"] == 0, rep  # converged to begin with
    for i, breaks in BREAKS.items():
        for sh, _step in breaks:
            r = lab_ssh(i, sh)
            assert r.returncode == 0, (sh, r.stderr)
    # the login shell, as an admin would change it (usermod on the node's /etc)
    subprocess.run(
        ["usermod", "--prefix", str(lab.nodes[2].home.parent), "--shell", "/bin/tcsh", lab.user],
        check=True,
        capture_output=True,
    )
    code, rep = _provision(lab, lab_settings, provisioned, capsys, check=True)
    assert code == 0, rep
    wanted = {i: [step for _sh, step in b] for i, b in BREAKS.items()}
    wanted[2].append("shell: user.shell")
    for i, steps in wanted.items():
        got = _statuses(rep, lab.nodes[i].name)
        for start in steps:
            names = _named(got, start)
            assert names and all(got[n] == "changed" for n in names), (
                lab.nodes[i].name,
                start,
                got,
            )
    code, rep = _provision(lab, lab_settings, provisioned, capsys)
    assert code == 0 and rep["failed"] == 0, rep
    code, rep = _provision(lab, lab_settings, provisioned, capsys)
    assert code == 0 and rep["changed"] == 0, rep
    r = lab_ssh(2, f"{VENV}/bin/python -c 'import numpy, torch; print(numpy.ones(2).sum())'")
    assert (r.returncode, r.stdout.strip()) == (0, "2.0"), r.stderr


def test_a_torch_that_does_not_import_is_never_ok_again(
    provisioned, lab, lab_settings, lab_ssh, capsys
):
    """The issue's defect: pip's metadata matched, the verify's import failed, and the next run
    said "nothing to change". Here torch's import is made to fail by a .pth file before the
    verify runs (nothing pip would see); the run fails, and so does the next one."""
    pth = f"{SITE}/zz_np_break.pth"
    assert (
        lab_ssh(
            1,
            f"rm -f {VENV}/.nodeprep-verified && set -- {SITE} && "
            f'echo "import sys; sys.modules[\'torch\'] = None" > "$1/zz_np_break.pth"',
        ).returncode
        == 0
    )
    try:
        for _ in range(2):
            code, rep = _provision(lab, lab_settings, provisioned, capsys)
            got = _statuses(rep, "worker-1")
            verify = _named(got, "torch: torch.verify")
            assert code == 1 and verify and got[verify[0]] == "failed", got
            assert rep["nodes"]["worker-1"]["status"] == "failed"
    finally:
        assert lab_ssh(1, f"rm -f {pth}").returncode == 0
    code, rep = _provision(lab, lab_settings, provisioned, capsys)
    assert (
        code == 0
        and _statuses(rep, "worker-1")[_named(_statuses(rep, "worker-1"), "torch: torch.verify")[0]]
        == "changed"
    )
    code, rep = _provision(lab, lab_settings, provisioned, capsys)
    assert code == 0 and rep["changed"] == 0, rep


@pytest.fixture(autouse=True)
def _shell_back(lab):
    yield
    subprocess.run(
        ["usermod", "--prefix", str(lab.nodes[2].home.parent), "--shell", "/bin/bash", lab.user],
        check=True,
        capture_output=True,
    )
