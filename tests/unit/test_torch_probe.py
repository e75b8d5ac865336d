"""The torch probe (TORCH_BUILD's sh, nodeprep.engine.facts.python) as a node runs it: one probe
section under /bin/sh, against a venv whose torch fails to import or takes its time. It caches
its answer in ~/.nodeprep/torch_probe.<machine-id>.json through a temp file of its own: a probe
that fails, or is stopped, must leave neither that temp file nor a cache entry behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from nodeprep.engine import facts
from nodeprep.engine.facts.python import TORCH_BUILD, TorchIn


def venv_with_torch(tmp_path: Path, init: str) -> Path:
    """A venv (no pip) whose site-packages holds a `torch` package with INIT as __init__.py."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    torch = next(venv.glob("lib/python*/")) / "site-packages" / "torch"
    torch.mkdir(parents=True)
    (torch / "__init__.py").write_text(init)
    (torch / "version.py").write_text("__version__ = '2.5.1+cu124'\n")
    return venv


def probe(venv: Path, home: Path) -> tuple[list, dict]:
    """The probe script of one TORCH_BUILD request and the environment it runs in."""
    script = facts.probe_script([TORCH_BUILD(TorchIn(str(venv)))], {}, "t")
    return ["/bin/sh", "-c", script], {"HOME": str(home), "PATH": "/usr/bin:/bin"}


def left_in(home: Path) -> list[str]:
    return sorted(p.name for p in (home / ".nodeprep").iterdir())


def test_a_probe_whose_torch_fails_to_import_leaves_no_temp_file(tmp_path):
    """torch present but broken (a CUDA library missing): the answer is the error, nothing is
    cached (the next probe tries again), and no torch_probe.*.json.<pid>.tmp is left."""
    venv = venv_with_torch(
        tmp_path,
        "raise ImportError('libcudart.so.12: cannot open shared "
        "object file: No such file or directory')\n",
    )
    home = tmp_path / "home"
    home.mkdir()
    cmd, env = probe(venv, home)
    for _ in range(2):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        got = facts.parse_sections(
            "n", [TORCH_BUILD(TorchIn(str(venv)))], r.stdout, "t", r.returncode
        )
        assert got[TORCH_BUILD(TorchIn(str(venv)))] == {
            "error": "ImportError: libcudart.so.12: "
            "cannot open shared object file: No such file or directory"
        }
        assert "@@t:rc=1@@" in r.stdout  # the section's status is python's
        assert left_in(home) == []


def test_a_probe_stopped_while_torch_imports_leaves_no_temp_file(tmp_path):
    """The probe stopped as nodeprep stops a node's command (TERM to its process group: the
    probe's `timeout`, a Ctrl-C on the controller) while `import torch` runs: its temp file
    goes too."""
    venv = venv_with_torch(tmp_path, "import time\ntime.sleep(60)\n")
    home = tmp_path / "home"
    home.mkdir()
    cmd, env = probe(venv, home)
    p = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        while not (home / ".nodeprep").is_dir() or not left_in(home):  # the import has begun
            assert time.monotonic() < deadline and p.poll() is None, (
                "the probe never wrote its temp file"
            )
            time.sleep(0.02)
        assert [n.endswith(".tmp") for n in left_in(home)] == [True]
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(30)
        deadline = time.monotonic() + 10  # the section's subshell may outlive the main sh
        while left_in(home) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert left_in(home) == []
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the group this test started, if anything is left
        except ProcessLookupError:
            pass
        p.wait()
